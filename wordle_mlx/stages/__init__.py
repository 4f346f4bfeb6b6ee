"""Pipeline stages. Each module has a config model and a `run(cfg)` that reads top to bottom."""
