"""The wordle-mlx test suite (unittest; run with `make test` or `python scripts/run_tests.py`)."""
