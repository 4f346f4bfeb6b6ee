"""Pipeline stages. Each stage module has a config model and a `run(cfg)` that reads top to bottom, and imports
no other stage; the command layer runs them (`cli.py`, and `plan_measure` for `plan --measure`). Beside the
stages sit modules that are not stages: their configs, which the planner reads too (`*_config`), the pattern
table loader (`pattern_table`), the dtype vocabulary (`precision`) and export's side files (`export_files`).
"""
