"""The policy a training run trains: the base model with LoRA layers, fresh or from a start adapter.

`load_policy(model, lora, seed, adapter, prompt, decode, trains_free)` loads the `model` section's base in its
dtype; with a start `adapter` (`start_adapter(cfg)`) it loads that adapter as mlx-lm does (its own rank, scale and layers, cast to the model before its weights go in, so they
load bit for bit), else it adds fresh LoRA layers from the `lora` section, seeded by `seed`. Only LoRA weights train: those of the
last `lora.train_layers` blocks when set. The adapter config it returns is what the run saves with its adapter:
the layout, the base model, the prompt it plays and the decoding it was trained for (`decode`, and whether the
whole reply was trained over the vocabulary, which free decoding needs: by the full loss, by `train_free`, or by the
start adapter).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ...config import display_path, resolve_path
from ...errors import UserError
from ..model.logits import set_grad_checkpoint
from ..model.lora import adapter_config, apply_lora, freeze_lora_below, lora_parameters, lora_to_float32
from ..model.memory import configure_metal_memory
from ..model.models import load_model
from ..play.prompts import ADAPTER_PROMPT_KEY, PromptConfig
from ..play.reply_grammar import LEGACY_TAGS_KEY, adapter_decoding, decoding_record


def start_adapter(cfg) -> Path | None:
    """`model.adapter` resolved against the config's folder, or None; a folder that is not there is an error."""
    if not cfg.model.adapter:
        return None
    path = resolve_path(cfg, cfg.model.adapter).resolve()
    if not path.is_dir():
        raise UserError(f"model.adapter {display_path(path)}: no such adapter folder (train one with `wordle-mlx sft`, "
                        "or set model.adapter, or null for a fresh LoRA)")
    return path


def trained_record(decode: str, trains_free: bool, start: Path | None) -> dict:
    """What the adapter records it was trained for: `decode`, and whether its whole reply was trained over the
    vocabulary (by the full loss of free decoding, by `trains_free`, or by the start adapter)."""
    return decoding_record(decode, decode == "free" or trains_free or bool(adapter_decoding(start)[1]))


def load_policy(model_cfg, lora, seed: int, adapter: Path | None, prompt: PromptConfig, decode: str,
                trains_free: bool):
    """(model, tokenizer, adapter config, trainable parameter count) for a training run: the config's `model` and
    `lora` sections, the run seed and the resolved start adapter (None: a fresh LoRA)."""
    model, tokenizer = load_model(model_cfg.name, adapter_path=adapter, dtype=model_cfg.dtype)
    if adapter is not None:
        acfg = json.loads((adapter / "adapter_config.json").read_text())
        model.freeze()
        lora_layers = [m for _, m in model.named_modules() if hasattr(m, "lora_a")]
        if not lora_layers:
            raise UserError(f"model.adapter {str(adapter)!r}: no LoRA layers (only LoRA adapters can be trained "
                            "further)")
        for m in lora_layers:
            m.unfreeze(keys=["lora_a", "lora_b"], recurse=False)
            if hasattr(m, "dropout"):    # the run's dropout, not the adapter's
                m.dropout = nn.Dropout(p=lora.dropout)
        acfg["lora_parameters"] = dict(acfg.get("lora_parameters", {}), dropout=lora.dropout)
        lora_to_float32(model)           # an adapter saved in bfloat16 trains on in float32
    else:
        params = lora_parameters(lora.rank, lora.scale, lora.dropout, None)
        mx.random.seed(seed)             # a fresh LoRA's random init depends only on the run seed
        apply_lora(model, lora.num_layers, params)
        acfg = adapter_config(lora.num_layers, params, model_cfg.name)
    if lora.train_layers is not None:
        freeze_lora_below(model, lora.train_layers)
    if model_cfg.grad_checkpoint:
        set_grad_checkpoint(model)
    configure_metal_memory()
    acfg.pop(LEGACY_TAGS_KEY, None)       # a start adapter's old record: trained_free replaces it
    acfg.update({"base_model": model_cfg.name, ADAPTER_PROMPT_KEY: prompt.model_dump(),
                 **trained_record(decode, trains_free, adapter)})
    trainable = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    return model, tokenizer, acfg, trainable
