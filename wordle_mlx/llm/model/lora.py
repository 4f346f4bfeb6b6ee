"""LoRA adapters with mlx-lm's own layers, saved in mlx-lm's format, and resumable training checkpoints.

`apply_lora` freezes the model and swaps the chosen linear layers of the last `num_layers` blocks for
`mlx_lm.tuner.lora.LoRALinear` (via `linear_to_lora_layers`), so only `lora_a`/`lora_b` train.
`save_adapters` writes `adapters.safetensors` + `adapter_config.json` with the keys mlx-lm's
`load_adapters` reads (`fine_tune_type`, `num_layers`, `lora_parameters{rank, scale, dropout, keys}`),
plus `base_model` for our own mismatch check; `mlx_lm.load(model, adapter_path=...)` and
`mlx_lm.generate --adapter-path` accept the folder. A checkpoint folder adds `optimizer.safetensors`
(the flattened optimizer state, step included) and `trainer_state.json`; it is written in a temporary
sibling folder and renamed, and `latest` (a one-line file naming the newest complete checkpoint) is
replaced atomically afterwards, so a crash at any moment leaves the previous checkpoint usable. A write
that fails (disk full, permissions) becomes a one-line `UserError` naming the path, and an unreadable
checkpoint file a `UserError` naming that file. Test hook: `WORDLE_MLX_FAULT=checkpoint-write:N` makes
the N-th `save_checkpoint` of the process die with `os._exit(137)` (as `kill -9` would) halfway through
writing its files; `benchmarks/fault_injection.py` and `tests/test_faults.py` use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import linear_to_lora_layers

from ...errors import UserError
from ...storage.fileio import publish_dir, write_json_atomic, write_text_atomic

ADAPTER_WEIGHTS = "adapters.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
OPTIMIZER_STATE = "optimizer.safetensors"
TRAINER_STATE = "trainer_state.json"
LATEST = "latest"


def lora_parameters(rank: int, scale: float, dropout: float, keys: list[str] | None) -> dict:
    params = {"rank": rank, "scale": scale, "dropout": dropout}
    if keys is not None:
        params["keys"] = list(keys)
    return params


def adapter_config(num_layers: int, params: dict, base_model: str) -> dict:
    """The adapter_config.json content mlx-lm expects, plus the base model for our own mismatch check. mlx-lm
    ignores extra keys: the trainer adds the prompt settings the adapter was trained with
    (`prompts.ADAPTER_PROMPT_KEY`, `policy.py`), so eval, play and GRPO show it the prompts it knows."""
    return {"fine_tune_type": "lora", "num_layers": num_layers, "lora_parameters": params, "base_model": base_model}


def apply_lora(model, num_layers: int, params: dict) -> int:
    """Freeze `model` and add LoRA layers in place; returns the number of trainable parameters."""
    model.freeze()
    try:
        linear_to_lora_layers(model, num_layers, params)
    except ValueError as exc:
        raise UserError(f"lora: cannot apply LoRA: {exc}") from None
    count = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    if count == 0:
        raise UserError(f"lora: no layer matched keys {params.get('keys')}; nothing would train")
    return count


def lora_to_float32(model) -> int:
    """Cast every LoRA weight (`lora_a`, `lora_b`) of `model` to float32, whatever the base weights' dtype;
    returns how many were cast. The base may be bfloat16 or quantized, but LoRA weights and so their gradients
    and optimizer state stay float32: a bfloat16 weight (8 bits of mantissa) rounds away any update smaller
    than 1/256 of itself, which at GRPO's learning rates is most of them. The LoRA layer still computes in the
    input's dtype where mlx-lm's layer casts its output back (`LoRALinear.__call__`)."""
    cast = 0
    for _, module in model.named_modules():
        for name in ("lora_a", "lora_b"):
            value = module.get(name) if isinstance(module, dict) else None
            if isinstance(value, mx.array) and value.dtype != mx.float32:
                setattr(module, name, value.astype(mx.float32))
                cast += 1
    return cast


def adapter_weights(model) -> dict[str, mx.array]:
    """Every LoRA weight (`lora_a`, `lora_b`) by name, trainable or frozen (`lora.train_layers` freezes some):
    what an adapter file holds."""
    return {k: v for k, v in tree_flatten(model.parameters()) if k.rsplit(".", 1)[-1] in ("lora_a", "lora_b")}


def freeze_lora_below(model, train_layers: int) -> int:
    """Freeze the LoRA weights of every block but the last `train_layers` of `model.layers` (the blocks
    `apply_lora`'s `num_layers` counts from the end); they keep acting and stop training. Returns the number of
    trainable parameters left."""
    blocks = model.layers
    if train_layers > len(blocks):
        raise UserError(f"lora.train_layers = {train_layers} is more than the {len(blocks)} blocks of the model")
    for block in blocks[: len(blocks) - train_layers]:
        for _, module in block.named_modules():
            if hasattr(module, "lora_a"):
                module.freeze(keys=["lora_a", "lora_b"], recurse=False)
    return sum(v.size for _, v in tree_flatten(model.trainable_parameters()))


_checkpoint_writes = 0


def _fault_hook_mid_checkpoint() -> None:
    """The WORDLE_MLX_FAULT=checkpoint-write:N test hook (see the module docstring); a no-op otherwise."""
    global _checkpoint_writes
    spec = os.environ.get("WORDLE_MLX_FAULT", "")
    if not spec.startswith("checkpoint-write:"):
        return
    _checkpoint_writes += 1
    if _checkpoint_writes == int(spec.split(":", 1)[1]):
        os._exit(137)


def _write_failed(what: str, path: Path, exc: BaseException) -> UserError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else " ".join(str(exc).split())
    return UserError(f"{path}: cannot write {what}: {reason} (disk full?)")


def _write_adapter_files(folder: Path, model, config: dict) -> None:
    mx.save_safetensors(str(folder / ADAPTER_WEIGHTS), adapter_weights(model))
    write_json_atomic(folder / ADAPTER_CONFIG, config)


def _temp_dir_beside(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))


@contextlib.contextmanager
def _built_folder(target: Path, what: str) -> Iterator[Path]:
    """Yield a temp folder beside `target`; publish it as `target` on success, delete it on failure.

    Write failures (MLX reports a full disk as RuntimeError("[write] ...")) become one-line errors
    naming `target`; the previous `target`, if any, is left as it was.
    """
    try:
        tmp = _temp_dir_beside(target)
    except OSError as exc:
        raise _write_failed(what, target, exc) from None
    try:
        yield tmp
        publish_dir(tmp, target)
    except (OSError, RuntimeError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_failed(what, target, exc) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_adapters(folder: str | Path, model, config: dict) -> Path:
    """Write the adapter folder (mlx-lm format) atomically."""
    folder = Path(folder)
    with _built_folder(folder, "adapters") as tmp:
        _write_adapter_files(tmp, model, config)
    return folder


def save_checkpoint(checkpoints: str | Path, step: int, model, optimizer, config: dict, state: dict) -> Path:
    """checkpoints/step_NNNNNN/ with adapters, optimizer state and trainer state; then `latest` points at it."""
    checkpoints = Path(checkpoints)
    target = checkpoints / f"step_{step:06d}"
    with _built_folder(target, "checkpoint") as tmp:
        _write_adapter_files(tmp, model, config)
        _fault_hook_mid_checkpoint()
        mx.save_safetensors(str(tmp / OPTIMIZER_STATE), dict(tree_flatten(optimizer.state)))
        write_json_atomic(tmp / TRAINER_STATE, {"step": step, **state})
    try:
        write_text_atomic(checkpoints / LATEST, target.name + "\n")
    except OSError as exc:
        raise _write_failed("checkpoint", target, exc) from None
    return target


def prune_checkpoints(checkpoints: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints (never the one `latest` names)."""
    checkpoints = Path(checkpoints)
    latest = latest_checkpoint(checkpoints)
    done = sorted(p for p in checkpoints.glob("step_*") if (p / TRAINER_STATE).is_file())
    for old in done[: max(len(done) - keep, 0)]:
        if latest is None or old != latest:
            shutil.rmtree(old, ignore_errors=True)
    for stale in checkpoints.glob(".step_*"):   # temp folders of writes killed midway (one writer per run)
        shutil.rmtree(stale, ignore_errors=True)
    for stale in checkpoints.glob(f".{LATEST}.*"):   # the pointer's temp file, from a kill while it was written
        stale.unlink(missing_ok=True)


def latest_checkpoint(checkpoints: str | Path) -> Path | None:
    """The newest complete checkpoint: the highest step folder with its trainer state (a folder is built beside
    and renamed, so a complete one is whole). `latest` names it too, but a kill between the folder's rename and the
    pointer's update leaves the pointer one checkpoint behind, so the folders decide."""
    done = sorted(p for p in Path(checkpoints).glob("step_*") if (p / TRAINER_STATE).is_file())
    return done[-1] if done else None


def _set_path(tree, path: list[str], value) -> None:
    node = tree
    for key in path[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(path[-1])] = value
    else:
        node[path[-1]] = value


def _read_checkpoint_file(path: Path, reader):
    try:
        return reader(str(path))
    except (OSError, ValueError, RuntimeError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else " ".join(str(exc).split())
        raise UserError(f"{path}: unreadable checkpoint file: {detail[:200]}") from None


def load_checkpoint(folder: str | Path, model, optimizer) -> dict:
    """Restore adapter weights and optimizer state from `folder`; returns the trainer state."""
    folder = Path(folder)
    weights = _read_checkpoint_file(folder / ADAPTER_WEIGHTS, mx.load)
    saved_opt = _read_checkpoint_file(folder / OPTIMIZER_STATE, mx.load)
    state = _read_checkpoint_file(folder / TRAINER_STATE, lambda p: json.loads(Path(p).read_text()))
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise UserError(f"{folder / TRAINER_STATE}: corrupt checkpoint: no integer 'step'")
    expected = adapter_weights(model)
    if set(weights) != set(expected) or any(weights[k].shape != expected[k].shape for k in weights):
        raise UserError(f"{folder}: checkpoint adapters do not match this model's LoRA layers")
    model.load_weights(list(weights.items()), strict=False)
    lora_to_float32(model)
    optimizer.init(model.trainable_parameters())
    current = dict(tree_flatten(optimizer.state))
    if set(saved_opt) != set(current):
        raise UserError(f"{folder}: optimizer state does not match this optimizer and model")
    for key, value in saved_opt.items():     # in the fresh state's dtype (float32 moments for float32 LoRA)
        _set_path(optimizer.state, key.split("."), value.astype(current[key].dtype))
    mx.eval(model.parameters(), optimizer.state)
    return state


@contextlib.contextmanager
def lora_disabled(model) -> Iterator[int]:
    """Run the base model: every LoRA layer's scale is 0 inside the block (yields how many were switched off)."""
    layers = [m for _, m in model.named_modules() if hasattr(m, "lora_a") and hasattr(m, "scale")]
    saved = [m.scale for m in layers]
    try:
        for m in layers:
            m.scale = 0.0
        yield len(layers)
    finally:
        for m, s in zip(layers, saved):
            m.scale = s
