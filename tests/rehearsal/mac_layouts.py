"""Random checkpoints laid out like the Mac models `mlx-community/gemma-3-4b-it-bf16` and `-4bit`.

`make_mac_layout(path, kind, seed, size)` writes a model folder of kind "float32", "bfloat16" or "4bit"
shaped like those repos: a `model_type "gemma3"` multimodal wrapper config whose `text_config` carries
the 4B's keys (hidden size, layers, heads, KV heads, head size, MLP width, sliding window and pattern,
rope settings, `query_pre_attn_scalar`, ...) and whose `vision_config` is a SigLIP one; `eos_token_id
[1, 106]`; `language_model.model.*` weights with tied embeddings over the 4B's 262,208-row vocabulary;
random `vision_tower.*` and `multi_modal_projector.*` tensors; and Gemma 3's real tokenizer, copied from
`builtin:gemma-3-270m` (262,144 tokens, so the embedding covers it). `size="tiny"` (the tests) shrinks
the dimensions; `size="4b"` has the 4B's real ones (3.9B text parameters, a 27-layer SigLIP tower),
written in shards of at most 5 GB with `model.safetensors.index.json`, as the repos are; `rehearsal_model`
builds it once in the user cache. Weights are drawn one tensor at a time from `seed` (linears uniform in
+-1/sqrt(fan in) as `nn.Linear` draws them, the embedding normal with std 1/sqrt(hidden), norms small), so a
full-size float32 copy never exists. The 4-bit kind is made from the bfloat16 one by mlx-lm's own converter
(`mlx_lm.convert(quantize=True, q_bits=4, q_group_size=64)`), which drops the vision tensors as mlx-lm
drops them on load; they are then added back unquantized, as the mlx-community repo (converted by mlx-vlm)
has them. Plain `mlx_lm.load` accepts every kind.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.convert import convert
from mlx_lm.models.gemma3_text import Model, ModelArgs
from mlx_lm.utils import make_shards

from wordle_mlx.llm.model.models import cached_build, gemma_270m_dir
from wordle_mlx.storage.fileio import write_json_atomic

KINDS = ("float32", "bfloat16", "4bit")
SIZES = ("tiny", "4b")
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
# The real dimensions of mlx-community/gemma-3-4b-it-bf16 (its config.json's text_config and vision_config).
TEXT_CONFIG_4B = {**TEXT_CONFIG, "hidden_size": 2560, "num_hidden_layers": 34, "intermediate_size": 10240,
                  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                  "query_pre_attn_scalar": 256, "sliding_window": 1024, "sliding_window_pattern": 6}
VISION_CONFIG_4B = {**VISION_CONFIG, "hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16,
                    "num_hidden_layers": 27, "image_size": 896}
CONFIGS = {"tiny": (TEXT_CONFIG, VISION_CONFIG, 4), "4b": (TEXT_CONFIG_4B, VISION_CONFIG_4B, 256)}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SHARD_GB = 5                      # mlx-lm's and mlx-vlm's largest shard


def wrapper_config(dtype: str, size: str = "tiny") -> dict:
    text, vision, image_tokens = CONFIGS[size]
    return {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "boi_token_index": 255_999, "eoi_token_index": 256_000, "image_token_index": 262_144,
            "mm_tokens_per_image": image_tokens, "eos_token_id": [1, 106], "bos_token_id": 2, "pad_token_id": 0,
            "vocab_size": VOCAB_4B, "torch_dtype": dtype, "text_config": dict(text), "vision_config": dict(vision)}


def text_shapes(text: dict) -> dict:
    """{name: shape} of a `gemma3_text` model's parameters (tied embedding: no lm_head), read off an mlx-lm
    model whose lazily drawn initial values are never computed."""
    shapes = {name: tuple(value.shape) for name, value in tree_flatten(Model(ModelArgs.from_dict(text)).parameters())}
    shapes.pop("lm_head.weight", None)
    return shapes


def vision_shapes(vision: dict, text_hidden: int) -> dict:
    """{name: shape} of the SigLIP tower and Gemma 3 projector tensors, named as in the mlx-community repos."""
    h, m = vision["hidden_size"], vision["intermediate_size"]
    p, patches = vision["patch_size"], (vision["image_size"] // vision["patch_size"]) ** 2
    tower, emb = "vision_tower.vision_model", "vision_tower.vision_model.embeddings"
    shapes = {f"{emb}.patch_embedding.weight": (h, p, p, 3), f"{emb}.patch_embedding.bias": (h,),
              f"{emb}.position_embedding.weight": (patches, h), f"{tower}.post_layernorm.weight": (h,),
              f"{tower}.post_layernorm.bias": (h,), "multi_modal_projector.mm_input_projection_weight": (h, text_hidden),
              "multi_modal_projector.mm_soft_emb_norm.weight": (h,)}
    for i in range(vision["num_hidden_layers"]):
        layer = f"{tower}.encoder.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes.update({f"{layer}.self_attn.{proj}.weight": (h, h), f"{layer}.self_attn.{proj}.bias": (h,)})
        shapes.update({f"{layer}.mlp.fc1.weight": (m, h), f"{layer}.mlp.fc1.bias": (m,),
                       f"{layer}.mlp.fc2.weight": (h, m), f"{layer}.mlp.fc2.bias": (h,)})
        for norm in ("layer_norm1", "layer_norm2"):
            shapes.update({f"{layer}.{norm}.weight": (h,), f"{layer}.{norm}.bias": (h,)})
    return shapes


def random_tensor(name: str, shape: tuple, key, dtype):
    """One tensor drawn as mlx's layers draw their initial values; Gemma's norms scale by (1 + w), so their w
    is small."""
    if name.endswith("norm.weight") or len(shape) == 1:
        value = 0.1 * mx.random.normal(shape, key=key) if name.endswith("norm.weight") else mx.zeros(shape)
    elif "embed_tokens" in name or "position_embedding" in name:
        value = mx.random.normal(shape, key=key) * (shape[-1] ** -0.5)
    else:
        bound = (math.prod(shape[1:])) ** -0.5
        value = mx.random.uniform(-bound, bound, shape, key=key)
    value = value.astype(dtype)
    mx.eval(value)
    return value


def random_weights(size: str, seed: int, dtype) -> dict:
    """Every tensor of the layout, text (`language_model.*`) and vision, drawn one at a time from `seed`."""
    text, vision, _ = CONFIGS[size]
    shapes = {f"language_model.{name}": shape for name, shape in text_shapes(text).items()}
    shapes.update(vision_shapes(vision, text["hidden_size"]))
    key, out = mx.random.key(seed), {}
    for name in sorted(shapes):
        key, sub = mx.random.split(key)
        out[name] = random_tensor(name, shapes[name], sub, dtype)
    return out


def save_shards(out: Path, weights: dict) -> None:
    """model.safetensors, or model-0000i-of-0000n.safetensors shards of at most SHARD_GB with their index."""
    shards = make_shards(weights, SHARD_GB)
    if len(shards) == 1:
        mx.save_safetensors(str(out / "model.safetensors"), shards[0], metadata={"format": "mlx"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(out / name), shard, metadata={"format": "mlx"})
        weight_map.update({tensor: name for tensor in shard})
    total = sum(v.nbytes for v in weights.values())
    write_json_atomic(out / "model.safetensors.index.json",
                      {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


def write_float_layout(out: Path, dtype: str, seed: int, size: str = "tiny") -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", wrapper_config(dtype, size))
    write_json_atomic(out / "generation_config.json", {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0})
    save_shards(out, random_weights(size, seed, getattr(mx, dtype)))
    source = gemma_270m_dir("float32")
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, out / name)


def make_mac_layout(path: str | Path, kind: str, seed: int = 0, size: str = "tiny", bf16: Path | None = None) -> Path:
    """Write the Mac-layout checkpoint `kind` ("float32", "bfloat16" or "4bit") of `size` into folder `path`;
    a 4-bit one is quantized from the bfloat16 folder `bf16` of the same seed and size when it is given."""
    if kind not in KINDS:
        raise ValueError(f"unknown Mac layout {kind!r}; use one of {', '.join(KINDS)}")
    if size not in SIZES:
        raise ValueError(f"unknown layout size {size!r}; use one of {', '.join(SIZES)}")
    out = Path(path)
    if kind != "4bit":
        write_float_layout(out, kind, seed, size)
        return out
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        if bf16 is None:
            bf16 = Path(tmp) / "bf16"
            write_float_layout(bf16, "bfloat16", seed, size)
        if out.exists():
            shutil.rmtree(out)
        convert(str(bf16), str(out), quantize=True, q_bits=4, q_group_size=64)
        vision = {}
        for shard in sorted(bf16.glob("model*.safetensors")):
            vision.update({k: v for k, v in mx.load(str(shard)).items() if not k.startswith("language_model.")})
        shards = sorted(out.glob("model*.safetensors"))
        weights = mx.load(str(shards[-1]))
        weights.update(vision)
        mx.save_safetensors(str(shards[-1]), weights, metadata={"format": "mlx"})
        index_path = out / "model.safetensors.index.json"
        if index_path.is_file():              # the index names every tensor's shard, the vision ones too
            index = json.loads(index_path.read_text())
            index["weight_map"].update({name: shards[-1].name for name in vision})
            write_json_atomic(index_path, index)
    return out


def rehearsal_model(kind: str, seed: int = 0) -> Path:
    """The full-size random 4B checkpoint of `kind` in the user cache, built the first time it is asked for
    (about 8.6 GB for bfloat16, 3 GB for 4-bit)."""
    bf16 = rehearsal_model("bfloat16", seed) if kind == "4bit" else None
    return cached_build(f"rehearsal-gemma-3-4b-it-{kind}-seed{seed}",
                        lambda folder: make_mac_layout(folder, kind, seed, size="4b", bf16=bf16))
