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
"""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
import mlx_lm
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import dequantize_model, load_config as load_model_config, save
from pydantic import Field, field_validator

from ..config import StrictModel, display_path
from ..errors import UserError
from ..llm.model.cpu_kernels import use_fast_gelu
from ..llm.model.fuse_bounds import logits_limit, unit_roundoff, weight_error
from ..llm.model.lora import lora_disabled
from ..llm.model.models import load_model, local_model_folder, resolve_model
from ..llm.play.prompts import PromptConfig, build_messages
from .precision import FUSE_DTYPES, accepted_dtype


def use_fast_gelu_like(fresh, loaded_by_us):
    """`fresh` (loaded by plain mlx-lm) with the GELU kernel `loaded_by_us` (`llm.model.models.load_model`) uses."""
    if any(type(m).__name__.startswith("FastGelu") for _, m in loaded_by_us.named_modules()):
        use_fast_gelu(fresh)
    return fresh


class FuseConfig(StrictModel):
    model: str = "builtin:gemma-3-270m"
    adapter: str
    out: str
    dtype: str | None = Field(None, description="float32, bfloat16 or float16 (default: float32 on CPU); the "
                              "vocabulary of `stages/precision.py`.")
    rtol: float = Field(1e-4, ge=0, description="Relative tolerance (to the largest |logit|) of the check, on top "
                        "of the rounding and quantization allowance of `fuse_bounds.logits_limit`.")
    atol: float = Field(1e-4, ge=0)
    dequantize: bool = Field(False, description="Quantized base: write the fused model dequantized (in the base's "
                             "float dtype, or `dtype`) rather than re-quantized.")
    overwrite: bool = False

    @field_validator("dtype")
    @classmethod
    def _fuse_writes(cls, value: str | None) -> str | None:
        return accepted_dtype("fuse", value, FUSE_DTYPES)


REQUANTIZED_SHARE = 0.5    # a re-quantized fuse may be off base + adapter by at most this share of the adapter's effect
VISION_NOTE = "vision part dropped: the fused model is text-only (mlx-lm loads Gemma 3's language model only)"


def check_batch(tokenizer) -> list[int]:
    """Token ids of a fixed prompt (a board with two guesses) rendered with the chat template."""
    messages = build_messages(PromptConfig(), [("soare", "XXYXG"), ("clint", "YXXXX")])
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)


def fuse_lora_layers(model, dequantize: bool = False, check=None) -> int:
    """Replace every module that has `fuse()` (mlx-lm's LoRA layers) by its fused layer; returns how many.
    `check(name, lora_layer, fused_layer)` runs on each pair as it is made (one layer's copies at a time)."""
    fused = []
    for name, module in [(n, m) for n, m in model.named_modules() if hasattr(m, "fuse")]:
        layer = module.fuse(dequantize=dequantize)
        mx.eval(layer.parameters())
        if check is not None:
            check(name, module, layer)
        fused.append((name, layer))
    if fused:
        model.update_modules(tree_unflatten(fused))
    return len(fused)


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


def run(cfg: FuseConfig) -> dict:
    out = Path(cfg.out)
    if out.exists() and not cfg.overwrite:
        raise UserError(f"--out {display_path(out)}: already exists; pass --overwrite to replace it")
    model, tokenizer = load_model(cfg.model, adapter_path=cfg.adapter, dtype=cfg.dtype)
    tokens = check_batch(tokenizer)
    inputs = mx.array([tokens])
    reference = model(inputs)
    base_logits = without_adapter(model, inputs)        # what the adapter changes is what a fuse must keep
    mx.eval(reference, base_logits)
    adapter_effect, _ = max_difference(reference, base_logits)
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
        model = dequantize_model(model)
        for section in (config, config.get("text_config", {})):    # mlx-lm reads either
            section.pop("quantization", None)
            section.pop("quantization_config", None)
    has_vision = "vision_config" in config
    weights = [v for k, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)
               and not k.endswith(("scales", "biases"))]
    config["torch_dtype"] = str(weights[0].dtype).replace("mlx.core.", "")
    if quantized and cfg.dequantize:     # every other quantized weight is now rounded to the float dtype once
        rho = max(rho, unit_roundoff(weights[0].dtype))
    in_memory = model(inputs)            # the fused model as it is saved, before the round trip through disk
    mx.eval(in_memory)
    requantized = quantized and not cfg.dequantize
    tmp = out.with_name(f".{out.name}.fusing")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save(tmp, source, model, tokenizer, config, donate_model=False)
        fused_model, fused_tok = mlx_lm.load(str(tmp))
        fused = fused_model(inputs)
        same_kernels = use_fast_gelu_like(fused_model, model)       # the in-memory model's GELU kernel too
        saved_diff, saved_scale = max_difference(same_kernels(inputs), in_memory)   # same weights: rounding only
        saved_limit = logits_limit(saved_scale, len(model.layers), reference.dtype, 0.0, cfg.rtol, cfg.atol)
        if not saved_diff <= saved_limit:
            raise UserError(f"fuse check failed: the saved model's logits differ from the fused model's in memory by "
                            f"{saved_diff:.3g} (limit {saved_limit:.3g}); output removed")
        diff, scale, limit = check_fused_logits(fused, reference, len(model.layers), requantized, adapter_effect,
                                                rho, cfg)
        if check_batch(fused_tok) != tokens:
            raise UserError("fuse check failed: the saved tokenizer/chat template renders prompts differently; output removed")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    output = "dequantized" if quantized and cfg.dequantize else "re-quantized" if quantized else "float"
    return {"out": display_path(out), "fused_layers": n_fused, "max_abs_logit_diff": diff, "max_abs_logit": scale,
            "tolerance": limit, "within_tolerance": bool(diff <= limit), "adapter_effect": adapter_effect,
            "weight_perturbation": rho, "dtype": config["torch_dtype"], "output": output,
            "vision": VISION_NOTE if has_vision else "none in the base model"}
