"""The one training loop of `wordle-mlx sft` and `wordle-mlx train` (GRPO).

`open_run(cfg, world)` and `train(cfg, task, run_dir, ...)` own everything the two stages share: the run folder and its
config snapshot, resume and overwrite, the optimizer and its schedule (`make_optimizer`), the metrics file (and
`run.report_to`'s TensorBoard or wandb), the progress bar, stop signals, checkpoints, non-finite steps,
validation and the adapter it keeps, and the result. A stage supplies a `Task`: how one step computes its update
(`step`, which calls `apply_update` with its gradient and returns the step's metrics), how it validates, and the
state its checkpoints must carry (data position, prompt cursor, random streams). The loop reads top to bottom:
resume or start, validate the start when the run keeps the best adapter, then per step: update, log, stop after
`NONFINITE_STOP` non-finite steps in a row, validate, checkpoint, check the stop signals. Ctrl-C or SIGTERM ends
the run after the current step with a checkpoint there; a second Ctrl-C drops the unfinished step.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np

from ...config import config_hash, config_relative_path, display_path, resolve_path
from ...errors import UserError
from ...fileio import remove_tree, write_json_atomic
from ...metrics import MetricsWriter, truncate_after_step
from ...progress import console, progress_bar
from ...stop_signals import StopSignals, agreed_stop
from ..model.lora import latest_checkpoint, load_checkpoint, prune_checkpoints, save_adapters, save_checkpoint
from ..model.memory import free_cache
from .distributed import NullWriter, World, check_world_size, write_weights_hash

NONFINITE_STOP = 3          # non-finite steps in a row (their updates skipped) that stop a run
KEEP_CHECKPOINTS = 2        # the newest checkpoints a run keeps


class NonFiniteStop(UserError):
    """Too many non-finite steps in a row: the run stopped with a checkpoint."""


def lr_schedule(opt, steps: int):
    """Linear warmup from lr / (warmup + 1) to lr over `warmup_steps` steps, then a cosine decay to
    lr x min_lr_ratio at the last step (constant when min_lr_ratio is 1)."""
    decay = optim.cosine_decay(opt.learning_rate, max(steps - opt.warmup_steps, 1),
                               opt.learning_rate * opt.min_lr_ratio)
    if opt.warmup_steps == 0:
        return decay
    warmup = optim.linear_schedule(opt.learning_rate / (opt.warmup_steps + 1), opt.learning_rate, opt.warmup_steps)
    return optim.join_schedules([warmup, decay], [opt.warmup_steps])


def make_optimizer(opt, steps: int):
    """(optimizer, schedule) for the `optimizer` section of a run of `steps` steps."""
    schedule = lr_schedule(opt, steps)
    if opt.name == "sgd":
        return optim.SGD(learning_rate=schedule), schedule
    return optim.AdamW(learning_rate=schedule, weight_decay=0.0), schedule     # mlx's default decay is 0.01


def apply_update(model, optimizer, grads, max_grad_norm: float, loss: float) -> tuple[float, bool]:
    """Clip `grads` to `max_grad_norm` (0: no clip) and apply them, unless the loss or the norm is not finite
    (then the weights stay as they are). Returns (the gradient's norm before clipping, whether it was applied)."""
    grads, norm = optim.clip_grad_norm(grads, max_grad_norm if max_grad_norm > 0 else float("inf"))
    grad_norm = float(norm.item())
    finite = bool(np.isfinite(loss) and np.isfinite(grad_norm))
    if finite:
        optimizer.update(model, grads)
        mx.eval(model.trainable_parameters(), optimizer.state)
    return grad_norm, finite


@dataclass
class Task:
    """What a stage supplies to the loop. `step(step)` makes one update and returns its metrics (with `loss`
    and `applied`); `validate(step)` returns a validation record's fields (with `win_rate` when it plays games),
    or None when it has nothing to check; `state()` and `restore(state)` carry what a checkpoint must resume."""
    kinds: tuple[str, str]                         # metrics record kinds: (step, validation)
    step: Callable[[int], dict]
    validate: Callable[[int], dict | None]
    state: Callable[[], dict]
    restore: Callable[[dict], None]
    info: Callable[[dict], str]                    # the progress bar's text after a step
    describe: str = ""                             # the run's first line: what it trains on
    keep_best: bool = False                        # validation picks the adapter (the start is step 0)
    run_fields: dict = field(default_factory=dict)
    saved_paths: dict = field(default_factory=dict)   # config fields (dotted) holding paths: the resolved path


def prepare_run_dir(cfg, stage: str) -> Path:
    """The run folder: `run.resume`'s, or a new one under logs_dir (a non-empty one only with overwrite)."""
    if cfg.run.resume is not None:
        run_dir = Path(cfg.run.resume)
        if not (run_dir / "config.json").is_file():
            raise UserError(f"--resume {cfg.run.resume}: not a run folder (no config.json)")
        return run_dir
    name = cfg.run.name or time.strftime(f"{stage}-%Y%m%d-%H%M%S")
    run_dir = resolve_path(cfg, cfg.run.logs_dir).resolve() / name
    if run_dir.exists() and any(run_dir.iterdir()):
        if not cfg.run.overwrite:
            shown = display_path(run_dir)
            raise UserError(f"run folder {shown} already exists; pass --overwrite or --run-name NEW or "
                            f"--resume {shown}")
        remove_tree(run_dir)   # a kill midway leaves the old run whole or gone
    return run_dir             # made once the run has started (a failed start leaves no folder behind)


def open_run(cfg, world: World) -> Path:
    """The run folder every rank uses (`prepare_run_dir` on rank 0): called first, so a folder that is in the way
    is refused before the model loads."""
    return Path(world.broadcast_json(str(prepare_run_dir(cfg, cfg.STAGE)) if world.is_main else None))


def saved_config(cfg, run_dir: Path, paths: dict) -> dict:
    """The config as the run folder keeps it: its paths relative to the run folder while both lie inside the
    working folder (what `--resume` resolves them against), and resume / overwrite off."""
    saved = cfg.model_dump(mode="json")
    saved["run"].update(resume=None, overwrite=False, name=run_dir.name,
                        logs_dir=config_relative_path(run_dir.parent, run_dir))
    for dotted, path in paths.items():
        section, key = dotted.split(".")
        saved[section][key] = config_relative_path(path, run_dir) if path is not None else None
    return saved


def copy_adapter(source: Path, target: Path) -> None:
    """Replace the adapter folder `target` with a copy of `source` (copied beside it, then renamed)."""
    tmp = target.with_name(f".{target.name}.copy")
    if tmp.exists():
        remove_tree(tmp)
    shutil.copytree(source, tmp)
    if target.exists():
        remove_tree(target)
    tmp.rename(target)


def train(cfg, task: Task, run_dir: Path, model, optimizer, schedule, adapter_cfg: dict, world: World) -> dict:
    """Run `task` for cfg.run.steps steps in `run_dir` (from `open_run`; see the module docstring); returns the
    result."""
    main, show, stage = world.is_main, cfg.run.progress and world.is_main, cfg.STAGE
    checkpoints, resume = run_dir / "checkpoints", cfg.run.resume is not None
    saved = saved_config(cfg, run_dir, task.saved_paths)
    loop = {"step": 0, "best_win_rate": None, "best_step": None, "nonfinite_in_row": 0, "nonfinite_total": 0}
    if resume:
        state = None
        if main:                         # rank 0 reads the checkpoint; the others receive it
            ckpt = latest_checkpoint(checkpoints)
            if ckpt is None:
                raise UserError(f"--resume {cfg.run.resume}: no complete checkpoint in {display_path(checkpoints)}")
            state = load_checkpoint(ckpt, model, optimizer)
        else:
            optimizer.init(model.trainable_parameters())
        state = world.broadcast_json(state)
        check_world_size(state, world, f"--resume {cfg.run.resume}")
        loop.update({k: state.get(k, loop[k]) for k in loop})
        task.restore(state)
    else:
        optimizer.init(model.trainable_parameters())   # the full state from step 0, so every checkpoint has it
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(run_dir / "config.json", saved)
    world.broadcast_training_state(model, optimizer)   # every rank starts from rank 0's weights and moments
    if resume and main:
        truncate_after_step(run_dir / "metrics.jsonl", loop["step"])   # steps logged after it are redone
    metrics = (MetricsWriter(run_dir / "metrics.jsonl", report_to=cfg.run.report_to, run_name=run_dir.name)
               if main else NullWriter())
    step_kind, valid_kind = task.kinds

    def checkpoint(at: int) -> Path:
        if main:
            save_checkpoint(checkpoints, at, model, optimizer, adapter_cfg,
                            {**task.state(), **loop, "step": at, "world_size": world.size})
            prune_checkpoints(checkpoints, KEEP_CHECKPOINTS)
        return checkpoints / f"step_{at:06d}"

    def validation(at: int) -> dict | None:
        fields = task.validate(at)
        if fields is None:
            return None
        free_cache()                     # validation's buffers, before the next step
        record = {"kind": valid_kind, "step": at, "time": time.time(), **fields}
        if task.keep_best and "win_rate" in fields:
            better = loop["best_win_rate"] is None or fields["win_rate"] > loop["best_win_rate"]
            record["best"] = better
            if better:
                loop["best_win_rate"], loop["best_step"] = fields["win_rate"], at
                if main:
                    save_adapters(run_dir / "adapters_best", model, adapter_cfg)
        metrics.write(record)
        return record

    metrics.write({"kind": "run", "stage": stage, "run": run_dir.name, "config_hash": config_hash(saved),
                   "config": saved, "time": time.time(), "resumed_from_step": loop["step"] if resume else None,
                   "world_size": world.size, **task.run_fields})
    steps, step = cfg.run.steps, loop["step"]
    if show:
        console.print(f"{stage} {run_dir.name}: {task.describe}, steps {step + 1}..{steps}")
    every = cfg.validation.every
    last, last_valid, stop_reason, stop_signal = {}, None, "finished", None
    if task.keep_best and every and step == 0:
        last_valid = validation(0)       # the start adapter, the curve's step 0
    stop, done_step = StopSignals(announce=main), step
    try:
        with stop, progress_bar(stage, steps, enabled=show) as advance:
            advance(step)
            while step < steps:
                before = task.state()
                step += 1
                mx.reset_peak_memory()
                lr = float(schedule(optimizer.step))      # the rate this update applies
                fields = task.step(step)
                loop["step"] = done_step = step                     # its update is in: the step is done
                finite = fields.pop("finite", fields["applied"])   # an update with nothing to train is finite
                loop["nonfinite_in_row"] = 0 if finite else loop["nonfinite_in_row"] + 1
                loop["nonfinite_total"] += 0 if finite else 1
                last = {"kind": step_kind, "step": step, "time": time.time(), "lr": lr, **fields,
                        "nonfinite_skips": loop["nonfinite_total"]}
                metrics.write(last)
                advance(1, info=task.info(last))
                if loop["nonfinite_in_row"] >= NONFINITE_STOP:
                    path = checkpoint(step)
                    raise NonFiniteStop(f"stopping at step {step}: the loss or gradient was not finite "
                                        f"{loop['nonfinite_in_row']} steps in a row (updates skipped; lower "
                                        f"optimizer.learning_rate); checkpoint saved in {display_path(path)}")
                if every and (step % every == 0 or step == steps):
                    last_valid = validation(step) or last_valid
                if cfg.run.save_every and step % cfg.run.save_every == 0 and step < steps:
                    checkpoint(step)
                if step < steps:
                    stop_signal = agreed_stop(stop, world)
                    if stop_signal:
                        stop_reason = f"stopped by {stop_signal}"
                        break
    except KeyboardInterrupt:
        stop_reason, stop_signal = "interrupted", "SIGINT"
        if done_step != step:            # the interrupted step never finished: forget it
            step = loop["step"] = done_step
            task.restore(before)
        console.print(f"interrupted: saving a checkpoint at step {step}")
    finally:
        metrics.close()
    path = checkpoint(step)
    write_weights_hash(model, world, stage)
    keep_best = task.keep_best and loop["best_step"] is not None and stop_reason == "finished"
    adapters = run_dir / "adapters"
    if main:
        if keep_best:
            copy_adapter(run_dir / "adapters_best", adapters)
        else:
            save_adapters(adapters, model, adapter_cfg)
        kept = f" (the best validation step's, {loop['best_step']})" if keep_best else ""
        if show:
            console.print(f"{stop_reason} at step {step}: adapters{kept} in {display_path(adapters)}")
    return {"run": display_path(run_dir), "step": step, "stopped": stop_reason, "signal": stop_signal,
            "adapters": display_path(adapters), "checkpoint": display_path(path),
            "adapters_are": "best" if keep_best else "last", "best_valid_step": loop["best_step"],
            "best_valid_win_rate": loop["best_win_rate"], "final_loss": last.get("loss"),
            "val_loss": (last_valid or {}).get("val_loss"), "peak_memory_gb": round(mx.get_peak_memory() / 1e9, 3),
            "last": {k: v for k, v in last.items() if k != "games"}}
