"""wordle-mlx: teach a Gemma 3 language model to play Wordle with SFT and GRPO on Apple's MLX."""

__version__ = "0.1.0"
