"""Everything that touches MLX language models: finding, importing, building and loading them.

`models.resolve_model` / `models.load_model` turn a model spec (a Hugging Face repo id, a local MLX
folder, a `.gguf` file, `builtin:gemma-3-270m` or `builtin:tiny-random`) into a loaded mlx-lm model and
tokenizer; `gguf_import` converts llama.cpp GGUF files into mlx-lm folders; `tokenizer_build` writes
Gemma-style Hugging Face tokenizer files; `tiny_model` makes a tiny random Gemma 3 for fast tests.
"""
