"""Tiny random checkpoints laid out like the Mac models `mlx-community/gemma-3-4b-it-bf16` and `-4bit`.

`make_mac_layout(path, kind)` writes a model folder of kind "float32", "bfloat16" or "4bit" shaped like those
repos, at tiny sizes: a `model_type "gemma3"` multimodal wrapper config whose `text_config` carries the
4B's keys (hidden size, layers, heads, KV heads, head size, MLP width, sliding window and pattern, rope
settings, `query_pre_attn_scalar`, ...) and whose `vision_config` is a small SigLIP one; `eos_token_id
[1, 106]`; `language_model.model.*` weights with tied embeddings over the 4B's 262,208-row vocabulary;
small random `vision_tower.*` and `multi_modal_projector.*` tensors; and Gemma 3's real tokenizer, copied
from `builtin:gemma-3-270m` (262,144 tokens, so the embedding covers it). The 4-bit kind is made from the
bfloat16 one by mlx-lm's own converter (`mlx_lm.convert(quantize=True, q_bits=4, q_group_size=64)`), which
drops the vision tensors as mlx-lm drops them on load; they are then added back unquantized, as the
mlx-community repo (converted by mlx-vlm) has them. Plain `mlx_lm.load` accepts every kind.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from ..fileio import write_json_atomic

KINDS = ("float32", "bfloat16", "4bit")
VOCAB_4B = 262_208
TEXT_CONFIG = {
    "model_type": "gemma3_text",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "query_pre_attn_scalar": 16,
    "sliding_window": 32,
    "sliding_window_pattern": 2,
    "max_position_embeddings": 131_072,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "vocab_size": VOCAB_4B,
}
VISION_CONFIG = {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                 "num_attention_heads": 2, "num_hidden_layers": 1, "image_size": 28, "patch_size": 14,
                 "num_channels": 3, "layer_norm_eps": 1e-6, "vision_use_head": False}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def wrapper_config(dtype: str) -> dict:
    return {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "boi_token_index": 255_999, "eoi_token_index": 256_000, "image_token_index": 262_144,
            "mm_tokens_per_image": 4, "eos_token_id": [1, 106], "bos_token_id": 2, "pad_token_id": 0,
            "vocab_size": VOCAB_4B, "torch_dtype": dtype, "text_config": dict(TEXT_CONFIG),
            "vision_config": dict(VISION_CONFIG)}


def vision_weights(seed: int, dtype) -> dict:
    """Small random SigLIP tower and Gemma 3 projector tensors, named as in the mlx-community repos."""
    import mlx.core as mx

    h, m = VISION_CONFIG["hidden_size"], VISION_CONFIG["intermediate_size"]
    p, patches = VISION_CONFIG["patch_size"], (VISION_CONFIG["image_size"] // VISION_CONFIG["patch_size"]) ** 2
    emb, layer = "vision_tower.vision_model.embeddings", "vision_tower.vision_model.encoder.layers.0"
    shapes = {f"{emb}.patch_embedding.weight": (h, p, p, 3), f"{emb}.patch_embedding.bias": (h,),
              f"{emb}.position_embedding.weight": (patches, h),
              "vision_tower.vision_model.post_layernorm.weight": (h,),
              "vision_tower.vision_model.post_layernorm.bias": (h,),
              "multi_modal_projector.mm_input_projection_weight": (h, TEXT_CONFIG["hidden_size"]),
              "multi_modal_projector.mm_soft_emb_norm.weight": (h,)}
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        shapes.update({f"{layer}.self_attn.{proj}.weight": (h, h), f"{layer}.self_attn.{proj}.bias": (h,)})
    shapes.update({f"{layer}.mlp.fc1.weight": (m, h), f"{layer}.mlp.fc1.bias": (m,),
                   f"{layer}.mlp.fc2.weight": (h, m), f"{layer}.mlp.fc2.bias": (h,)})
    for norm in ("layer_norm1", "layer_norm2"):
        shapes.update({f"{layer}.{norm}.weight": (h,), f"{layer}.{norm}.bias": (h,)})
    key = mx.random.key(seed + 7)
    out = {}
    for name in sorted(shapes):
        key, sub = mx.random.split(key)
        out[name] = (0.02 * mx.random.normal(shapes[name], key=sub)).astype(dtype)
    return out


def write_float_layout(out: Path, dtype: str, seed: int) -> None:
    import mlx.core as mx

    from .models import gemma_270m_dir
    from .tiny_model import tiny_weights

    text = tiny_weights(seed, TEXT_CONFIG)
    weights = {f"language_model.{name}": value.astype(getattr(mx, dtype)) for name, value in text.items()}
    weights.update(vision_weights(seed, getattr(mx, dtype)))
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", wrapper_config(dtype))
    write_json_atomic(out / "generation_config.json", {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0})
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    source = gemma_270m_dir("float32")
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, out / name)


def make_mac_layout(path: str | Path, kind: str, seed: int = 0) -> Path:
    """Write the tiny Mac-layout checkpoint `kind` ("float32", "bfloat16" or "4bit") into folder `path`."""
    import mlx.core as mx

    if kind not in KINDS:
        raise ValueError(f"unknown Mac layout {kind!r}; use one of {', '.join(KINDS)}")
    out = Path(path)
    if kind != "4bit":
        write_float_layout(out, kind, seed)
        return out
    from mlx_lm.convert import convert

    with tempfile.TemporaryDirectory() as tmp:
        bf16 = Path(tmp) / "bf16"
        write_float_layout(bf16, "bfloat16", seed)
        if out.exists():
            shutil.rmtree(out)
        convert(str(bf16), str(out), quantize=True, q_bits=4, q_group_size=64)
        shards = sorted(out.glob("model*.safetensors"))
        weights = mx.load(str(shards[-1]))
        vision = vision_weights(seed, mx.bfloat16)
        weights.update(vision)
        mx.save_safetensors(str(shards[-1]), weights, metadata={"format": "mlx"})
        index_path = out / "model.safetensors.index.json"
        if index_path.is_file():              # the index names every tensor's shard, the vision ones too
            index = json.loads(index_path.read_text())
            index["weight_map"].update({name: shards[-1].name for name in vision})
            write_json_atomic(index_path, index)
    return out
