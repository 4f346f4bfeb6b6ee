"""`wordle-mlx fuse`: merge a LoRA adapter into the base weights, and prove the result before keeping it.

Loads the base model with the adapter (mlx-lm's loader), computes logits on a fixed batch (a rendered
Wordle prompt), replaces every LoRA layer by its `fuse()`d plain linear (W + scale * B^T A^T) and
saves the model with `mlx_lm.utils.save` (weights, config, tokenizer files with the chat template) into
a temporary folder beside `out`. That folder is then loaded back from disk with `mlx_lm.load` and its
logits on the same batch must match the adapter model's within `atol + rtol * max|logits|`, and its
chat template must render the prompt to the same tokens. Only then is the folder renamed to `out`;
on any mismatch the half-written output is removed and the command fails with a one-line error.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import Field

from ..config import StrictModel
from ..errors import UserError


class FuseConfig(StrictModel):
    model: str = "builtin:gemma-3-270m"
    adapter: str
    out: str
    dtype: str | None = None
    rtol: float = Field(1e-4, ge=0, description="Relative tolerance (to the largest |logit|) of the check.")
    atol: float = Field(1e-4, ge=0)
    overwrite: bool = False


def check_batch(tokenizer) -> list[int]:
    """Token ids of a fixed prompt (a board with two guesses) rendered with the chat template."""
    from ..llm.prompts import PromptConfig, build_messages

    messages = build_messages(PromptConfig(), [("soare", "XXYXG"), ("clint", "YXXXX")])
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)


def fuse_lora_layers(model) -> int:
    """Replace every module that has `fuse()` (mlx-lm's LoRA layers) by its fused layer; returns how many."""
    from mlx.utils import tree_unflatten

    fused = [(name, module.fuse()) for name, module in model.named_modules() if hasattr(module, "fuse")]
    if fused:
        model.update_modules(tree_unflatten(fused))
    return len(fused)


def max_difference(a, b) -> tuple[float, float]:
    import mlx.core as mx

    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return mx.abs(a - b).max().item(), mx.abs(a).max().item()


def run(cfg: FuseConfig) -> dict:
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _download, load_config as load_model_config, save

    from ..llm.models import load_model, resolve_model

    out = Path(cfg.out)
    if out.exists() and not cfg.overwrite:
        raise UserError(f"--out {out}: already exists; pass --overwrite to replace it")
    model, tokenizer = load_model(cfg.model, adapter_path=cfg.adapter, dtype=cfg.dtype)
    tokens = check_batch(tokenizer)
    inputs = mx.array([tokens])
    reference = model(inputs)
    mx.eval(reference)
    n_fused = fuse_lora_layers(model)
    if n_fused == 0:
        raise UserError(f"adapter {cfg.adapter}: no LoRA layers to fuse")
    source = Path(_download(str(resolve_model(cfg.model, cfg.dtype))))
    config = load_model_config(source)
    first_weight = tree_flatten(model.parameters())[0][1]
    config["torch_dtype"] = str(first_weight.dtype).replace("mlx.core.", "")
    tmp = out.with_name(f".{out.name}.fusing")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save(tmp, source, model, tokenizer, config, donate_model=False)
        fused_model, fused_tok = mlx_lm.load(str(tmp))
        fused = fused_model(inputs)
        diff, scale = max_difference(fused, reference)
        limit = cfg.atol + cfg.rtol * scale
        if not diff <= limit:
            raise UserError(f"fuse check failed: fused logits differ from the adapter model's by {diff:.3g} "
                            f"(limit {limit:.3g}); output removed")
        if check_batch(fused_tok) != tokens:
            raise UserError("fuse check failed: the saved tokenizer/chat template renders prompts differently; output removed")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(out), "fused_layers": n_fused, "max_abs_logit_diff": diff, "max_abs_logit": scale,
            "tolerance": limit, "dtype": config["torch_dtype"]}
