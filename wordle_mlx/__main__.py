"""`python -m wordle_mlx` runs the CLI."""

from .cli import main

main()
