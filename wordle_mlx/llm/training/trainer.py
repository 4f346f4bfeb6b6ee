"""The training loop of `wordle-mlx sft` and `wordle-mlx train` (GRPO), in mlx-lm's shape.

`train(model, optimizer, loss_fn, batches, args, evaluate=None, callbacks=())` is mlx-lm's `tuner.trainer.train`
for LoRA adapters: a stage hands it the model, the optimizer, a loss function and an iterator of `Batch`es, and
the loop owns the rest. Each step takes the next batch, sums the gradients of `loss_fn(model, *micro_batch)` over
its micro-batches and over every rank (`accumulate_gradients`, the one gradient accumulation of the package),
divides them by the batch's `count` (the step's target tokens over every rank: the token mean), clips them to
`args.max_grad_norm`, and applies them unless the loss or the gradient norm is not finite (`apply_update`). It
writes one `train` record a step to `metrics.jsonl`, validates every `args.steps_per_eval` steps (`evaluate(step)`
returns the `valid` record's fields; with `args.keep_best` the start is validated as step 0 and the adapter with
the highest `win_rate` is the run's), checkpoints every `args.steps_per_save` steps with the iterator's state
(`batches.state()`, so `--resume` continues the same data stream), stops after `NONFINITE_STOP` non-finite steps
in a row, and ends on Ctrl-C or SIGTERM after the current step with a checkpoint there (a second Ctrl-C drops the
unfinished step). SFT's batches are its data; GRPO's play their rollouts with the current model
(`llm/training/rl.py`).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map

from ...config import config_hash, display_path
from ...errors import UserError
from ...storage.fileio import remove_tree, write_json_atomic
from ...storage.metrics import MetricsWriter, truncate_after_step
from ...runtime.progress import console, progress_bar
from ...runtime.stop_signals import StopSignals, agreed_stop
from ..model.cpu_kernels import numpy_after_trace
from ..model.lora import latest_checkpoint, load_checkpoint, prune_checkpoints, save_adapters, save_checkpoint
from ..model.memory import free_cache
from .distributed import NullWriter, World, check_world_size, write_weights_hash

NONFINITE_STOP = 3          # non-finite steps in a row (their updates skipped) that stop a run
KEEP_CHECKPOINTS = 2        # the newest checkpoints a run keeps


class NonFiniteStop(UserError):
    """Too many non-finite steps in a row: the run stopped with a checkpoint."""


@dataclass
class Batch:
    """One step's data on this rank. `micro_batches` are `loss_fn`'s arguments after the model, their gradients
    summed (none: this rank adds zeros); `count` divides the summed gradient and loss (every rank's target tokens:
    the token mean; None when the loss weights already average over the step); `metrics` go into the step's
    record; `trainable` False (on every rank) records the step without an update."""
    micro_batches: Sequence[tuple]
    count: float | None = None
    metrics: dict = field(default_factory=dict)
    trainable: bool = True


@dataclass
class TrainingArgs:
    """How `train` runs, besides the model, optimizer, loss and data."""
    steps: int
    run_dir: Path
    adapter_config: dict                     # saved with every adapter and checkpoint
    config: dict                             # the run's config snapshot (config.json, the `run` record)
    stage: str = "train"
    max_grad_norm: float = 1.0               # 0: no clipping
    steps_per_eval: int = 0                  # validate every N steps and at the end; 0: never
    steps_per_save: int = 0                  # checkpoint every N steps (the end always); 0: only at the end
    keep_best: bool = False                  # validate the start as step 0 and keep the adapter with most wins
    resume: bool = False
    progress: bool = True
    report_to: tuple = ()
    schedule: Callable | None = None         # the learning rate schedule, logged as `lr`
    describe: str = ""                       # the run's first line: what it trains on
    progress_text: Callable[[dict], str] | None = None   # the progress bar's text after a step
    run_fields: dict = field(default_factory=dict)       # more fields of the `run` record


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


def accumulate_gradients(model, loss_and_grad, batch: Batch, world: World):
    """(gradient, loss, summed stats) of one step: the gradients and losses of the batch's micro-batches summed
    over every rank, both divided by `batch.count` when given (which equals the one-process gradient of the
    union of the ranks' micro-batches)."""
    grads, total, stats = None, 0.0, {}
    for args in batch.micro_batches:
        with numpy_after_trace():        # a numpy cross-entropy evaluating inside the trace would keep its graph
            (loss, aux), g = loss_and_grad(model, *args)
        grads = g if grads is None else tree_map(mx.add, grads, g)
        mx.eval(grads, loss, aux)
        total += loss.item()
        for k, v in aux.items():
            stats[k] = stats.get(k, 0.0) + v.item()
    if grads is None:                    # nothing on this rank; the others still need its zeros
        grads = tree_map(mx.zeros_like, model.trainable_parameters())
    grads = world.sum_tree(grads)
    keys = sorted(stats)
    total, *values = world.sum_floats([total, *(stats[k] for k in keys)])
    if batch.count is not None:
        grads = tree_map(lambda x: x / batch.count, grads)
        total = total / batch.count
    return grads, total, dict(zip(keys, values))


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


def copy_adapter(source: Path, target: Path) -> None:
    """Replace the adapter folder `target` with a copy of `source` (copied beside it, then renamed)."""
    tmp = target.with_name(f".{target.name}.copy")
    if tmp.exists():
        remove_tree(tmp)
    shutil.copytree(source, tmp)
    if target.exists():
        remove_tree(target)
    tmp.rename(target)


def train_step(model, optimizer, loss_and_grad, batch: Batch, max_grad_norm: float, world: World) -> dict:
    """One update from `batch`: its gradient, clipped and applied. Returns the step's record fields (`finite`:
    False when a non-finite loss or gradient skipped the update)."""
    start = time.perf_counter()
    if not batch.trainable:
        return {"loss": 0.0, "grad_norm": 0.0, "applied": False, "finite": True,
                "update_seconds": time.perf_counter() - start}
    model.train()
    grads, loss, stats = accumulate_gradients(model, loss_and_grad, batch, world)
    grad_norm, applied = apply_update(model, optimizer, grads, max_grad_norm, loss)
    return {"loss": loss, **stats, "grad_norm": grad_norm, "applied": applied, "finite": applied,
            "update_seconds": time.perf_counter() - start}


def train(model, optimizer, loss_fn, batches: Iterator[Batch], args: TrainingArgs,
          evaluate: Callable[[int], dict | None] | None = None, callbacks: Sequence = (),
          world: World | None = None) -> dict:
    """Train for `args.steps` steps (see the module docstring); returns the run's result. `loss_fn(model, *args)`
    returns (loss, {name: scalar to sum into the record}); `batches` may have `state()` and `restore(state)` for
    checkpoints; each callback may have `on_train(record)`, `on_valid(record)` and `on_end(result)`."""
    world = world or World()
    main, show, stage, run_dir = world.is_main, args.progress and world.is_main, args.stage, args.run_dir
    checkpoints = run_dir / "checkpoints"
    data_state = getattr(batches, "state", lambda: {})
    restore_data = getattr(batches, "restore", lambda state: None)
    loop = {"step": 0, "best_win_rate": None, "best_step": None, "nonfinite_in_row": 0, "nonfinite_total": 0}
    if args.resume:
        state = None
        if main:                         # rank 0 reads the checkpoint; the others receive it
            ckpt = latest_checkpoint(checkpoints)
            if ckpt is None:
                raise UserError(f"--resume {display_path(run_dir)}: no complete checkpoint in "
                                f"{display_path(checkpoints)}")
            state = load_checkpoint(ckpt, model, optimizer)
        else:
            optimizer.init(model.trainable_parameters())
        state = world.broadcast_json(state)
        check_world_size(state, world, f"--resume {display_path(run_dir)}")
        loop.update({k: state.get(k, loop[k]) for k in loop})
        restore_data(state)
    else:
        optimizer.init(model.trainable_parameters())   # the full state from step 0, so every checkpoint has it
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(run_dir / "config.json", args.config)
    world.broadcast_training_state(model, optimizer)   # every rank starts from rank 0's weights and moments
    if args.resume and main:
        truncate_after_step(run_dir / "metrics.jsonl", loop["step"])   # steps logged after it are redone
    metrics = (MetricsWriter(run_dir / "metrics.jsonl", report_to=args.report_to, run_name=run_dir.name)
               if main else NullWriter())
    loss_and_grad = nn.value_and_grad(model, loss_fn)

    def notify(event: str, record: dict) -> None:
        for cb in callbacks:
            if hasattr(cb, event):
                getattr(cb, event)(record)

    def checkpoint(at: int) -> Path:
        if main:
            save_checkpoint(checkpoints, at, model, optimizer, args.adapter_config,
                            {**data_state(), **loop, "step": at, "world_size": world.size})
            prune_checkpoints(checkpoints, KEEP_CHECKPOINTS)
        return checkpoints / f"step_{at:06d}"

    def validation(at: int) -> dict | None:
        fields = evaluate(at) if evaluate is not None else None
        if fields is None:
            return None
        free_cache()                     # validation's buffers, before the next step
        record = {"kind": "valid", "step": at, "time": time.time(), **fields}
        if args.keep_best and "win_rate" in fields:
            better = loop["best_win_rate"] is None or fields["win_rate"] > loop["best_win_rate"]
            record["best"] = better
            if better:
                loop["best_win_rate"], loop["best_step"] = fields["win_rate"], at
                if main:
                    save_adapters(run_dir / "adapters_best", model, args.adapter_config)
        metrics.write(record)
        notify("on_valid", record)
        return record

    metrics.write({"kind": "run", "stage": stage, "run": run_dir.name, "config_hash": config_hash(args.config),
                   "config": args.config, "time": time.time(),
                   "resumed_from_step": loop["step"] if args.resume else None, "world_size": world.size,
                   **args.run_fields})
    steps, step = args.steps, loop["step"]
    if show:
        console.print(f"{stage} {run_dir.name}: {args.describe}, steps {step + 1}..{steps}")
    every = args.steps_per_eval
    last, last_valid, stop_reason, stop_signal = {}, None, "finished", None
    if args.keep_best and every and step == 0:
        last_valid = validation(0)       # the start adapter, the curve's step 0
    stop, done_step = StopSignals(announce=main), step
    try:
        with stop, progress_bar(stage, steps, enabled=show) as advance:
            advance(step)
            while step < steps:
                before = data_state()
                step += 1
                mx.reset_peak_memory()
                lr = float(args.schedule(optimizer.step)) if args.schedule else None   # the rate this update applies
                start = time.perf_counter()
                batch = next(batches)
                fields = train_step(model, optimizer, loss_and_grad, batch, args.max_grad_norm, world)
                loop["step"] = done_step = step                     # its update is in: the step is done
                seconds = time.perf_counter() - start
                finite = fields.pop("finite")
                loop["nonfinite_in_row"] = 0 if finite else loop["nonfinite_in_row"] + 1
                loop["nonfinite_total"] += 0 if finite else 1
                update_seconds, peak = world.max_floats([fields.pop("update_seconds"), mx.get_peak_memory() / 1e9])
                last = {"kind": "train", "step": step, "time": time.time(), "lr": lr, **fields, **batch.metrics,
                        "update_seconds": update_seconds, "peak_memory_gb": peak,
                        "nonfinite_skips": loop["nonfinite_total"]}
                if "tokens" in batch.metrics:
                    last["tokens_per_second"] = batch.metrics["tokens"] / seconds
                metrics.write(last)
                notify("on_train", last)
                advance(1, info=args.progress_text(last) if args.progress_text else f"loss {last['loss']:.4f}")
                if loop["nonfinite_in_row"] >= NONFINITE_STOP:
                    path = checkpoint(step)
                    raise NonFiniteStop(f"stopping at step {step}: the loss or gradient was not finite "
                                        f"{loop['nonfinite_in_row']} steps in a row (updates skipped; lower "
                                        f"optimizer.learning_rate); checkpoint saved in {display_path(path)}")
                if every and (step % every == 0 or step == steps):
                    last_valid = validation(step) or last_valid
                if args.steps_per_save and step % args.steps_per_save == 0 and step < steps:
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
            restore_data(before)
        console.print(f"interrupted: saving a checkpoint at step {step}")
    finally:
        metrics.close()
    path = checkpoint(step)
    write_weights_hash(model, world, stage)
    keep_best = args.keep_best and loop["best_step"] is not None and stop_reason == "finished"
    adapters = run_dir / "adapters"
    if main:
        if keep_best:
            copy_adapter(run_dir / "adapters_best", adapters)
        else:
            save_adapters(adapters, model, args.adapter_config)
        kept = f" (the best validation step's, {loop['best_step']})" if keep_best else ""
        if show:
            console.print(f"{stop_reason} at step {step}: adapters{kept} in {display_path(adapters)}")
    result = {"run": display_path(run_dir), "step": step, "stopped": stop_reason, "signal": stop_signal,
              "adapters": display_path(adapters), "checkpoint": display_path(path),
              "adapters_are": "best" if keep_best else "last", "best_valid_step": loop["best_step"],
              "best_valid_win_rate": loop["best_win_rate"], "final_loss": last.get("loss"),
              "val_loss": (last_valid or {}).get("val_loss"), "peak_memory_gb": round(mx.get_peak_memory() / 1e9, 3),
              "last": {k: v for k, v in last.items() if k != "games"}}
    notify("on_end", result)
    return result
