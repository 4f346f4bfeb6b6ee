"""Charts and tables for `wordle-mlx plot`: reading run metrics and eval JSON, the arithmetic, the figures.

`runlog` turns a `metrics.jsonl` or an eval JSON into plain Python/numpy data (and reports bad input as
`UserError` with the line number), `stats` holds the pure arithmetic (cumulative wins, rolling win rate,
guess histograms, Wilson intervals, the Markdown table), `style` the shared figure helpers, and `charts`
/ `compare` draw the figures. Nothing here imports MLX.
"""
