"""`wordle-mlx fuse`: merge a LoRA adapter into the base weights, and prove the result before keeping it.

Loads the base model with the adapter (mlx-lm's loader), computes logits on a fixed batch (a rendered
Wordle prompt), replaces every LoRA layer by its `fuse()`d layer (W + scale * B^T A^T) and checks each fused
weight, element by element, against that sum computed exactly in float32, within what rounding to the
output's dtype or re-quantization allows (`llm/model/fuse_bounds.py`). A quantized base is re-quantized by
default, as mlx-lm does (lossy: one more quantization step on every adapted layer); `dequantize` writes
every weight in the base's float dtype (or `dtype`) instead, without the quantization config. The model is
saved with `mlx_lm.utils.save` (weights, config, tokenizer files with the chat template) into a temporary
folder beside `out` and loaded back from disk with `mlx_lm.load`: its logits on the same batch must equal the
fused model's in memory up to the forward pass's rounding, and, for a float output, the adapter model's within the limit derived
from the dtype, the number of blocks and the measured weight perturbation (`fuse_bounds.logits_limit`). A
re-quantized output's second 4-bit rounding is lossy by design, so it is held to what quantization can keep:
its logits must be closer to base + adapter than half the adapter's own effect (base + adapter against the
base alone); an adapter whose change is below the quantization step rounds away, and that fuse fails with a
pointer to `--dequantize`. Its chat template must render the prompt to the same tokens.
Only then is the folder renamed to `out`; on any mismatch the half-written output is removed and the command
fails with a one-line error. The vision part of a multimodal checkpoint (Gemma 3 4B's `vision_tower`,
`multi_modal_projector`, `vision_config`) is dropped, since mlx-lm loads the language model only: the output
is a text-only mlx-lm folder whose config.json matches its weights (mlx-lm and LM Studio load it as text).

Memory: no second full copy of the weights is ever alive. Each LoRA layer is fused, checked and put in its own
place before the next (its base weight then freed), `--dequantize` dequantizes the other quantized layers one at a
time the same way (the embedding in slices: `dequantized_weight`), `save` writes the model's own arrays shard by shard and gives them up as it goes, and the
first model is freed before the saved folder is loaded back. The peak is the larger of the base as loaded and
the output as saved, plus one layer's check and the check's logits (`planning/fuse_plan.py` plans it).
"""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx.utils import tree_flatten, tree_map, tree_unflatten
from mlx_lm.utils import load_config as load_model_config, save

from ..config import display_path
from ..errors import UserError
from ..llm.model.cpu_kernels import use_fast_gelu
from ..llm.model.fuse_bounds import logits_limit, unit_roundoff, weight_error
from ..llm.model.lora import lora_disabled
from ..llm.model.models import load_model, local_model_folder, resolve_model
from ..llm.play.prompts import PromptConfig, build_messages
from .fuse_config import FuseConfig


REQUANTIZED_SHARE = 0.5    # a re-quantized fuse may be off base + adapter by at most this share of the adapter's effect
VISION_NOTE = "vision part dropped: the fused model is text-only (mlx-lm loads Gemma 3's language model only)"


def check_batch(tokenizer) -> list[int]:
    """Token ids of a fixed prompt (a board with two guesses) rendered with the chat template."""
    messages = build_messages(PromptConfig(), [("soare", "XXYXG"), ("clint", "YXXXX")])
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)


def submodule(model, name: str):
    """The module at dotted path `name` ("model.layers.3.mlp.up_proj")."""
    module = model
    for part in name.split("."):
        module = module[int(part)] if isinstance(module, list) else module[part]
    return module


def replace_modules(model, names: list[str], make) -> None:
    """Replace each module named in `names`, one at a time, by `make(name, module)` (evaluated), in its own place:
    the old module's arrays are freed before the next is made, so only one layer is ever held twice."""
    for name in names:
        module = submodule(model, name)
        layer = make(name, module)
        mx.eval(layer.parameters())
        model.update_modules(tree_unflatten([(name, layer)]))
        del module, layer


def fuse_lora_layers(model, dequantize: bool = False, check=None) -> int:
    """Replace every module that has `fuse()` (mlx-lm's LoRA layers) by its fused layer, in place and one at a
    time; returns how many. `check(name, lora_layer, fused_layer)` runs on each pair before the swap."""
    names = [n for n, m in model.named_modules() if hasattr(m, "fuse")]

    def fused(name, module):
        layer = module.fuse(dequantize=dequantize)
        mx.eval(layer.parameters())
        if check is not None:
            check(name, module, layer)
        return layer

    replace_modules(model, names, fused)
    return len(names)


DEQUANTIZE_VALUES = 1 << 24     # values a `mx.dequantize` call makes at most (see `dequantized_weight`)


def dequantized_weight(module) -> mx.array:
    """The float weight of a quantized linear or embedding, made `DEQUANTIZE_VALUES` at a time into one array
    (each slice written in place): in one call `mx.dequantize` holds about 5 times its output in temporaries on
    the CPU, 5 GiB more for the 4B's 262k x 2560 embedding (measured: benchmarks/gemma3_4b_size.py)."""
    rows, args = module.weight.shape[0], (module.group_size, module.bits)
    biases = module.get("biases")
    step = max(1, DEQUANTIZE_VALUES // (module.scales.shape[1] * module.group_size))
    out = None
    for lo in range(0, rows, step):
        part = mx.dequantize(module.weight[lo:lo + step], module.scales[lo:lo + step],
                             None if biases is None else biases[lo:lo + step], *args,
                             mode=getattr(module, "mode", "affine"))
        if rows <= step:
            return part
        if out is None:
            out = mx.zeros((rows, part.shape[1]), part.dtype)
        out[lo:lo + step] = part
        mx.eval(out)
    return out


def dense_layer(name, module):
    """A quantized linear or embedding as its float twin (mlx-lm's `dequantize_model`, for one module)."""
    weight = dequantized_weight(module)
    if isinstance(module, nn.QuantizedEmbedding):
        layer = nn.Embedding(*weight.shape)
    else:
        layer = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in module)
        if "bias" in module:
            layer.bias = module.bias
    layer.weight = weight
    return layer


def dequantize_in_place(model) -> int:
    """Dequantize every quantized linear and embedding left, one module at a time; returns how many."""
    names = [n for n, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    replace_modules(model, names, dense_layer)
    return len(names)


def without_adapter(model, inputs):
    """The base model's logits on `inputs`: every LoRA layer's scale set to 0 for one forward pass."""
    with lora_disabled(model):
        return model(inputs)


def max_difference(a, b) -> tuple[float, float]:
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return mx.abs(a - b).max().item(), mx.abs(a).max().item()


def check_fused_logits(fused, reference, layers: int, requantized: bool, adapter_effect: float, rho: float,
                       cfg: FuseConfig) -> tuple[float, float, float]:
    """(max logit difference, logit scale, limit) of the saved fused model against base + adapter; over the limit
    is a UserError. A re-quantized fuse rounds every adapted weight to 4 bits a second time: it passes only if it
    keeps most of what the adapter does (an adapter's change smaller than the quantization step rounds away, and
    the "fused" model then plays like the base)."""
    diff, scale = max_difference(fused, reference)
    if requantized:
        limit = max(logits_limit(scale, layers, reference.dtype, 0.0, cfg.rtol, cfg.atol),
                    REQUANTIZED_SHARE * adapter_effect)
        if not diff <= limit:
            raise UserError(f"fuse check failed: the re-quantized model's logits differ from base + adapter by "
                            f"{diff:.3g}, more than {REQUANTIZED_SHARE:g} x the adapter's own effect "
                            f"({adapter_effect:.3g}): re-quantizing loses the adapter; pass --dequantize to keep "
                            "the fused weights in the float dtype; output removed")
    else:
        limit = logits_limit(scale, layers, reference.dtype, rho, cfg.rtol, cfg.atol)
        if not diff <= limit:
            raise UserError(f"fuse check failed: fused logits differ from the adapter model's by {diff:.3g} "
                            f"(limit {limit:.3g}); output removed")
    return diff, scale, limit


def free_model(model) -> None:
    """Give the model's arrays back before the next load: drop every parameter, collect, clear MLX's cache."""
    model.update(tree_map(lambda _: mx.array([]), model.parameters()))
    gc.collect()
    mx.clear_cache()


def run(cfg: FuseConfig, check_logits: bool = True) -> dict:
    """Fuse, save, load back and check. `check_logits=False` (benchmarks/gemma3_4b_size.py's full-size 4-bit
    run, whose forward passes take most of an hour on a CPU) keeps the weight and tokenizer checks and the
    round trip through disk, and leaves out the forward passes and their logit checks."""
    out = Path(cfg.out)
    if out.exists() and not cfg.overwrite:
        raise UserError(f"--out {display_path(out)}: already exists; pass --overwrite to replace it")
    model, tokenizer = load_model(cfg.model, adapter_path=cfg.adapter, dtype=cfg.dtype)
    tokens = check_batch(tokenizer)
    inputs = mx.array([tokens])
    reference = adapter_effect = None
    if check_logits:
        reference = model(inputs)
        base_logits = without_adapter(model, inputs)        # what the adapter changes is what a fuse must keep
        mx.eval(reference, base_logits)
        adapter_effect, _ = max_difference(reference, base_logits)
        del base_logits
    rho = 0.0

    def check_weights(name, lora_layer, fused_layer):
        nonlocal rho
        worst, layer_rho = weight_error(lora_layer, fused_layer)
        if not worst <= 1.0:
            raise UserError(f"fuse check failed: fused weight {name} is {worst:.3g} times further from W + scale B^T "
                            "A^T than rounding allows; nothing written")
        rho = max(rho, layer_rho)

    n_fused = fuse_lora_layers(model, cfg.dequantize, check_weights)
    if n_fused == 0:
        raise UserError(f"adapter {cfg.adapter}: no LoRA layers to fuse")
    source = local_model_folder(resolve_model(cfg.model, cfg.dtype))
    config = load_model_config(source)
    quantized = "quantization" in config or "quantization_config" in config
    if cfg.dequantize:
        dequantize_in_place(model)
        for section in (config, config.get("text_config", {})):    # mlx-lm reads either
            section.pop("quantization", None)
            section.pop("quantization_config", None)
    has_vision = "vision_config" in config
    dtype = next(v.dtype for k, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)
                 and not k.endswith(("scales", "biases")))
    config["torch_dtype"] = str(dtype).replace("mlx.core.", "")
    if quantized and cfg.dequantize:     # every other quantized weight is now rounded to the float dtype once
        rho = max(rho, unit_roundoff(dtype))
    in_memory = None
    if check_logits:
        in_memory = model(inputs)            # the fused model as it is saved, before the round trip through disk
        mx.eval(in_memory)
    requantized = quantized and not cfg.dequantize
    layers, fast_gelu = len(model.layers), any(type(m).__name__.startswith("FastGelu") for _, m in model.named_modules())
    tmp = out.with_name(f".{out.name}.fusing")
    shutil.rmtree(tmp, ignore_errors=True)
    diff = scale = limit = None
    try:
        save(tmp, source, model, tokenizer, config, donate_model=True)     # shard by shard, each array given up
        free_model(model)                                                   # before the saved copy is loaded
        del model
        fused_model, fused_tok = mlx_lm.load(str(tmp))
        if check_logits:
            fused = fused_model(inputs)
            if fast_gelu:                                  # the in-memory model's GELU kernel too
                use_fast_gelu(fused_model)
            saved_diff, saved_scale = max_difference(fused_model(inputs), in_memory)   # same weights: rounding only
            saved_limit = logits_limit(saved_scale, layers, reference.dtype, 0.0, cfg.rtol, cfg.atol)
            if not saved_diff <= saved_limit:
                raise UserError(f"fuse check failed: the saved model's logits differ from the fused model's in memory "
                                f"by {saved_diff:.3g} (limit {saved_limit:.3g}); output removed")
            diff, scale, limit = check_fused_logits(fused, reference, layers, requantized, adapter_effect, rho, cfg)
        if check_batch(fused_tok) != tokens:
            raise UserError("fuse check failed: the saved tokenizer/chat template renders prompts differently; output removed")
        del fused_model
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    output = "dequantized" if quantized and cfg.dequantize else "re-quantized" if quantized else "float"
    return {"out": display_path(out), "fused_layers": n_fused, "max_abs_logit_diff": diff, "max_abs_logit": scale,
            "tolerance": limit, "within_tolerance": None if diff is None else bool(diff <= limit),
            "adapter_effect": adapter_effect, "weight_perturbation": rho, "dtype": config["torch_dtype"],
            "output": output, "vision": VISION_NOTE if has_vision else "none in the base model",
            "logits_checked": check_logits}
