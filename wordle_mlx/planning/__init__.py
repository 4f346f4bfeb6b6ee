"""Memory planning: the expected peak memory of a stage before it runs.

`memory` holds the arithmetic (model dimensions and a stage's numbers to itemised bytes, the Mac sizes a peak
fits, the largest batch within a budget), `gemma3_sizes` the dimensions of the Gemma 3 checkpoints users name
before any download, and `stage_plan` reads a stage config and the model's config.json into those numbers
(and warns before step 1 when a plan exceeds this machine). The `wordle-mlx plan` command is `stages/plan.py`;
`plan --measure`, which runs stages, is `stages/plan_measure.py`.
"""
