"""Model files: specs to local mlx-lm folders to loaded models, GGUF import and export, tokenizers, the tiny test
model and the Mac layouts, LoRA adapters and checkpoints, fuse bounds, and the forward pass's helpers (logits at
selected positions, the CPU GELU, Metal memory)."""
