"""The expected peak memory of `wordle-mlx fuse` and `wordle-mlx export`, from their configs.

`fuse` (`stages/fuse.py`) replaces the LoRA layers in place, one at a time. Its fusing phase holds the base
weights as loaded (text only: mlx-lm drops a multimodal checkpoint's vision tower), the adapter, the blocks'
linears dequantized so far (`dequantize` on a quantized base), one layer's fused copy with its element-by-element
check (FUSE_CHECK_COPIES float32 copies of the largest adapted linear) and the adapter model's logits. Its checking
phases (the logits before the fuse, of the output in memory, and of the saved folder loaded back once the first
model is freed) hold the base or the output as saved (dequantized: every layer in the float dtype) and the
vocabulary-wide logits of a rendered prompt of about `check_tokens` tokens, with their float32 differences: at
the tests' tiny sizes those logits are most of the peak. The plan is the larger phase. `export` (`stages/export.py`) loads the base in its stored float dtype (a quantized base with
float32 scales) with the adapter, and writes one tensor at a time fused in float32: its peak is the weights, the
adapter and EXPORT_TENSOR_COPIES float32 copies of the largest tensor (the embedding), one of them in numpy.
`fuse_plan` and `export_plan` are pure functions of `memory.ModelDims`; `fuse_report` reads a config into them.
"""

from __future__ import annotations

import dataclasses
import math

from . import memory as mp

FUSE_CHECK_COPIES = 10            # float32 copies of a layer alive while `fuse_bounds.weight_error` checks it
FUSE_CHECK_COPIES_QUANTIZED = 12  # the same for a quantized layer (its dequantized base and fused weights)
FUSE_LOGIT_BYTES = 18            # bytes per check token and vocabulary entry: the logits kept and their float32 diffs
EXPORT_TENSOR_COPIES = 3          # float32: the fused tensor, its vocabulary rows, the numpy copy
CHECK_CHARS = 133                 # characters of `fuse.check_batch`'s messages (a board with two guesses)


def check_tokens() -> int:
    """Tokens of the fuse check's prompt, from its characters (as `stage_plan.prompt_token_estimate`)."""
    from .stage_plan import CHARS_PER_TOKEN, CHAT_TEMPLATE_TOKENS
    return math.ceil(CHECK_CHARS / CHARS_PER_TOKEN) + CHAT_TEMPLATE_TOKENS


def largest_adapted(d: mp.ModelDims, keys) -> int:
    """in x out of the largest linear an adapter on `keys` (None: every linear of a block) adapts."""
    shapes = d.linear_shapes()
    return max(i * o for k, (i, o) in shapes.items() if keys is None or k in keys)


def linear_bytes(d: mp.ModelDims, values: int) -> int:
    """Bytes of `values` linear weights as the model holds them: float, or `bits` with a scale and bias per group."""
    if d.bits is None:
        return values * d.value_bytes
    return values * d.bits // 8 + values // d.group_size * 2 * d.value_bytes


def fuse_plan(d: mp.ModelDims, rank: int, num_layers: int, keys, dequantize: bool, tokens: int) -> mp.MemoryPlan:
    """The peak of `fuse`, the larger of two phases (module docstring): fusing (the base, the adapter, the layers
    dequantized so far, one layer's check, the adapter model's logits kept) and checking (the base or the output,
    and the check's logits)."""
    lora = mp.lora_parameters(d, rank, num_layers, keys) * 4
    base = mp.weight_bytes(d)
    dense = mp.weight_bytes(dataclasses.replace(d, bits=None))
    grows = d.bits is not None and dequantize
    block_values = d.layers * sum(i * o for i, o in d.linear_shapes().values())
    blocks_growth = block_values * d.value_bytes - linear_bytes(d, block_values) if grows else 0
    output = dense - base if grows else 0
    copies = FUSE_CHECK_COPIES_QUANTIZED if d.bits is not None else FUSE_CHECK_COPIES
    layer = largest_adapted(d, keys)
    check = layer * (copies * 4 + d.value_bytes)
    kept = tokens * d.vocab * d.value_bytes
    logits = tokens * d.vocab * FUSE_LOGIT_BYTES
    fusing = {"weights": base, "lora": lora, "output": blocks_growth, "fused_layer": check, "logits": kept}
    checking = ({"weights": base, "output": output, "logits": logits} if output >= lora else
                {"weights": base, "lora": lora, "logits": logits})
    phase = "fusing" if sum(fusing.values()) >= sum(checking.values()) else "checking"
    items = fusing if phase == "fusing" else checking
    q = f"{d.bits}-bit" if d.bits else f"{d.value_bytes}-byte"
    notes = {"weights": f"the base as loaded ({q}, text only): " + mp.weight_note(d),
             "lora": f"{lora // 4:,} adapter params x 4 B",
             "output": ((f"the blocks' linears dequantized so far ({block_values:,} values)" if phase == "fusing" else
                         f"dequantized output {mp.gb(dense):.2f} GB in {d.value_bytes}-byte values, over the base's "
                         f"{mp.gb(base):.2f} GB") if grows else "fused in place: the output is the size of the base"),
             "fused_layer": (f"the largest adapted linear ({layer:,} values) fused and checked: {copies} float32 "
                             f"copies + its fused copy"),
             "logits": (f"the adapter model's logits kept: {tokens} check tokens x {d.vocab:,} x {d.value_bytes} B"
                        if phase == "fusing" else f"{tokens} check tokens x {d.vocab:,} x {FUSE_LOGIT_BYTES} B "
                        "(the logits compared and their float32 differences)"),
             "phase": (f"peak in the {phase} phase (fusing {mp.gb(sum(fusing.values())):.2f} GB: layers fused in "
                       f"place one at a time; checking {mp.gb(sum(checking.values())):.2f} GB: logits of the model "
                       "before and after, the first model freed before the saved folder is loaded back)")}
    return mp.MemoryPlan(items, {k: v for k, v in notes.items() if k in items or k == "phase"})


def export_plan(d: mp.ModelDims, rank: int, num_layers: int, keys) -> mp.MemoryPlan:
    """The peak of `export`: the weights as loaded, the adapter, and the largest tensor fused in float32."""
    lora = mp.lora_parameters(d, rank, num_layers, keys)
    largest = max(d.vocab * d.hidden, largest_adapted(d, None))
    items = {"weights": mp.weight_bytes(d), "lora": lora * 4, "tensor": largest * EXPORT_TENSOR_COPIES * 4}
    notes = {"weights": "the base as loaded (text only): " + mp.weight_note(d),
             "lora": f"{lora:,} adapter params x 4 B",
             "tensor": f"the largest tensor ({largest:,} values, the embedding) x {EXPORT_TENSOR_COPIES} float32 "
                       "copies (fused, its vocabulary rows, numpy's), written one tensor at a time",
             "phase": "one tensor at a time: no fused copy of the model"}
    return mp.MemoryPlan(items, notes)


def stored_float_dtype(config: dict) -> str | None:
    """The float dtype a model's config.json stores its weights in (None: quantized, or not said)."""
    if config.get("quantization") or config.get("quantization_config"):
        return None
    dtype = config.get("torch_dtype") or (config.get("text_config") or {}).get("torch_dtype")
    return dtype if dtype in ("float32", "bfloat16", "float16") else None


def fuse_report(kind: str, cfg, model_config: str | None = None, memory_gb: float | None = None) -> dict:
    """`wordle-mlx plan`'s answer for a FuseConfig (`kind` "fuse") or an ExportConfig ("export")."""
    from ..config import resolve_path
    from ..runtime import device
    from .stage_plan import adapter_layout, model_config_dict, model_dims, read_json_object, this_machine_working_set

    adapter_cfg = {}
    path = resolve_path(cfg, cfg.adapter) / "adapter_config.json"
    if path.is_file():
        adapter_cfg = read_json_object(path)
    spec = cfg.model or adapter_cfg.get("base_model") or "builtin:gemma-3-270m"
    config = model_config_dict(spec, model_config)
    dtype = cfg.dtype if kind == "fuse" else stored_float_dtype(config)
    dims = model_dims(config, dtype, model_config or f"model {spec!r} config.json", device.default_dtype() != "float32")
    if kind == "export" and dims.bits is not None:
        dims = dataclasses.replace(dims, value_bytes=4)      # a quantized base's scales in float32
    rank, num_layers, keys = adapter_layout(cfg, cfg.adapter, 16, -1, None)
    found = "adapter_config.json" if path.is_file() else "no adapter_config.json yet: rank 16 on every block"
    if kind == "fuse":
        plan = fuse_plan(dims, rank, num_layers, keys, cfg.dequantize, check_tokens())
        inputs = (f"adapter rank {rank} on {'all' if num_layers < 0 else num_layers} blocks ({found})"
                  + (", dequantized output" if cfg.dequantize and dims.bits else ""))
    else:
        plan = export_plan(dims, rank, num_layers, keys)
        inputs = f"adapter rank {rank} on {'all' if num_layers < 0 else num_layers} blocks ({found}), {cfg.dtype} GGUF"
    budget, where = ((mp.working_set(memory_gb), mp.working_set_note(memory_gb))
                     if memory_gb else this_machine_working_set())
    return {"stage": kind, "model": spec, "value_bytes": dims.value_bytes, "bits": dims.bits, "inputs": inputs,
            "items_gb": {k: round(mp.gb(v), 3) for k, v in plan.items.items()}, "notes": plan.notes,
            "peak_gb": round(mp.gb(plan.peak), 3), "fits_mac_gb": mp.fitting_sizes(plan.peak),
            "budget_gb": round(mp.gb(budget), 2), "budget": where, "fits_budget": plan.peak <= budget}
