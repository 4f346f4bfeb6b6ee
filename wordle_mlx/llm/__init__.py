"""Everything that touches MLX, in three folders; a change to one of them starts there.

- `model/`: the model files and their arithmetic. Specs to loaded (model, tokenizer) pairs (`models`), GGUF import
  and export, tokenizer building, the tiny test model, LoRA adapters and checkpoints, fuse bounds, logits at
  selected positions, the CPU GELU and Metal memory settings.
- `play/`: prompts and the reply parser, decoding (free, grammar, words: `reply_grammar`, `letter_decoder`,
  `generation`, over the token helpers of `tokens`), the multi-turn rollout engine and the episodes it leaves,
  candidate scores, the GBNF export.
- `training/`: the SFT data files, the SFT and GRPO losses, group advantages, the GRPO step (rollout, then update), step metrics and
  data parallelism over `mx.distributed`.
"""
