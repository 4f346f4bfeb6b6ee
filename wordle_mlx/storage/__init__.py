"""What the stages write and read back: atomic file writes and the user cache folder (`fileio`), the append-only
metrics JSONL (`metrics`) and its forwarding to TensorBoard or wandb (`reporting`, which imports them only when
asked). No mlx here, and `fileio` is stdlib only, so the pure game engine may use it.
"""
