"""The dimensions of the Gemma 3 checkpoints users name, so that `wordle-mlx plan` answers before a download.

`known_config(spec)` turns a Hugging Face repo id such as `mlx-community/gemma-3-4b-it-4bit` or
`google/gemma-3-1b-it` into the config.json that repo holds, as far as memory planning reads it: the text
dimensions of the 270M, 1B, 4B and 12B models (the 4B and 12B wrapped as multimodal `gemma3` configs, as
their repos are), the stored dtype and, for the `-8bit` / `-4bit` / `-qat-4bit` conversions, mlx-lm's
affine quantization with groups of 64. It returns None for any other name, and the planner then asks for
`--model-config`. The numbers are those of Google's published config.json files (and of mlx-community's
conversions of them); `tests/test_plan.py` checks the 4B's against the Mac-layout rehearsal checkpoint.
"""

from __future__ import annotations

import re

TEXT = {   # hidden, layers, MLP width, query heads, KV heads, sliding window, vocabulary
    "270m": (640, 18, 2048, 4, 1, 512, 262_144),
    "1b": (1152, 26, 6912, 4, 1, 512, 262_144),
    "4b": (2560, 34, 10240, 8, 4, 1024, 262_208),
    "12b": (3840, 48, 15360, 16, 8, 1024, 262_208),
}
MULTIMODAL = ("4b", "12b")
REPO = re.compile(r"^[\w.-]+/gemma-3-(?P<size>270m|1b|4b|12b)(?:-(?:it|pt))?(?:-qat)?"
                  r"(?:-(?P<precision>bf16|fp16|8bit|4bit|q4_0-unquantized))?$", re.IGNORECASE)


def text_config(size: str) -> dict:
    hidden, layers, mlp, heads, kv_heads, window, vocab = TEXT[size]
    return {"model_type": "gemma3_text", "hidden_size": hidden, "num_hidden_layers": layers,
            "intermediate_size": mlp, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": window, "sliding_window_pattern": 6,
            "vocab_size": vocab, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}


def known_config(spec: str) -> dict | None:
    """The planning part of the config.json of Gemma 3 repo `spec`, or None if the name is not one of them."""
    match = REPO.match(spec.strip())
    if match is None:
        return None
    size, precision = match["size"].lower(), (match["precision"] or "bf16").lower()
    text = text_config(size)
    dtype = "float16" if precision == "fp16" else "bfloat16"
    config = ({"model_type": "gemma3", "vocab_size": text["vocab_size"], "text_config": text}
              if size in MULTIMODAL else dict(text))
    config["torch_dtype"] = dtype
    if precision in ("8bit", "4bit"):
        config["quantization"] = {"group_size": 64, "bits": int(precision[0]), "mode": "affine"}
    return config
