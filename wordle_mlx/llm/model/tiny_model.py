"""A tiny random Gemma 3 model folder for fast tests (`builtin:tiny-random`).

`make_tiny_model_dir(path, seed)` writes a real mlx-lm model folder: a `gemma3_text` config with tiny
dimensions (2 layers, hidden 64, 4 query heads / 1 KV head of size 16, one sliding and one global
layer), random float32 weights drawn from `seed` (the same seed gives bitwise-identical weights), and a
character-level Gemma-style tokenizer: Gemma's control tokens (`<pad>` `<eos>` `<bos>` `<unk>`
`<start_of_turn>` `<end_of_turn>`), the tags `<think>` `</think>` `<guess>` `</guess>` as single tokens,
byte fallback for anything else, and Gemma 3's chat template. It loads with plain `mlx_lm.load(path)`.
"""

from __future__ import annotations

import string
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.gemma3_text import Model, ModelArgs

from ...storage.fileio import write_json_atomic
from .tokenizer_build import (TYPE_BYTE, TYPE_CONTROL, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_USER_DEFINED,
                              SPACE_PIECE, gemma_tokenizer_json, write_tokenizer_files)

TINY_VOCAB_SIZE = 384
TAG_TOKENS = ("<think>", "</think>", "<guess>", "</guess>")
CONTROL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")

TINY_CONFIG = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "vocab_size": TINY_VOCAB_SIZE,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "query_pre_attn_scalar": 16,
    "sliding_window": 32,
    "sliding_window_pattern": 2,
    "max_position_embeddings": 2048,
    "rope_scaling": None,
    "bos_token_id": 2,
    "pad_token_id": 0,
    "eos_token_id": [1, 5],
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """Pieces, scores and SentencePiece types of the tiny character-level vocabulary."""
    pieces, types = list(CONTROL_TOKENS), [TYPE_CONTROL, TYPE_CONTROL, TYPE_CONTROL, TYPE_UNKNOWN,
                                           TYPE_CONTROL, TYPE_CONTROL]
    pieces += ["\n", *TAG_TOKENS]
    types += [TYPE_USER_DEFINED] * (1 + len(TAG_TOKENS))
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [TYPE_BYTE] * 256
    chars = [SPACE_PIECE] + list(string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation)
    pieces += chars
    types += [TYPE_NORMAL] * len(chars)
    unused = TINY_VOCAB_SIZE - len(pieces)
    if unused < 0:
        raise AssertionError(f"tiny vocabulary needs {len(pieces)} ids, more than {TINY_VOCAB_SIZE}")
    pieces += [f"<unused{i}>" for i in range(unused)]
    types += [TYPE_CONTROL] * unused
    scores = [0.0 if t == TYPE_BYTE else (-float(i) if t == TYPE_NORMAL else -1000.0) for i, t in enumerate(types)]
    return pieces, scores, types


def tiny_weights(seed: int, config: dict | None = None) -> dict:
    """Random float32 weights of the tiny model, or of a `gemma3_text` `config` (no `lm_head`: embeddings
    are tied, as in Gemma 3)."""
    args = ModelArgs.from_dict(config or TINY_CONFIG)
    mx.random.seed(seed)
    model = Model(args)
    weights = dict(tree_flatten(model.parameters()))
    weights.pop("lm_head.weight", None)
    key = mx.random.key(seed + 1)
    for name in sorted(weights):
        if name.endswith("norm.weight"):
            # Gemma's RMSNorm scales by (1 + w); small random w keeps activations near unit scale.
            key, sub = mx.random.split(key)
            weights[name] = 0.1 * mx.random.normal(weights[name].shape, key=sub)
    weights = {name: value.astype(mx.float32) for name, value in weights.items()}
    mx.eval(weights)
    return weights


def make_tiny_model_dir(path: str | Path, seed: int = 0) -> Path:
    """Write the tiny random Gemma 3 model (config, weights, tokenizer) into folder `path`."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", TINY_CONFIG)
    write_json_atomic(out / "generation_config.json", {"bos_token_id": 2, "eos_token_id": [1, 5], "pad_token_id": 0})
    mx.save_safetensors(str(out / "model.safetensors"), tiny_weights(seed), metadata={"format": "mlx"})
    pieces, scores, types = tiny_vocab()
    write_tokenizer_files(out, gemma_tokenizer_json(pieces, scores, types), model_max_length=2048)
    return out
