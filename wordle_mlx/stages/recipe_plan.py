"""`wordle-mlx recipe --dry-run`: every stage still to run, its command, its planned peak memory and, where this
machine has run it before, its projected time; nothing is run or written.

The peak is the planner's (`planning/stage_plan`, `planning/fuse_plan`, as `wordle-mlx plan` reports it) for the
stage's config in the dtype the run would use here, or `--dtype`'s; a model that is not on disk is planned from
its known sizes (`recipe_model.model_config`), the fused model of a quantized base as the dense model it is
written as. Data, cover, entropy, plots and ship stages have no plan. The projected time is the measured seconds
per step or game of the same stage on this host (`recipe_run.read_rates`), times the stage's steps or games.
The last line is `stages N peak_gb X`: the stages still to run and the largest planned peak among them, in GiB.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from ..errors import UserError
from ..planning.fuse_plan import fuse_report
from .recipe_build import Stage
from .recipe_model import ModelSettings, dense_config, planned_peak_gb
from .recipe_run import is_done, projected_seconds, read_rates, resume_flags

PLANNED = ("sft", "grpo", "eval", "self-play")


def stage_peak_gb(stage: Stage, settings: ModelSettings, memory_gb: float | None) -> float | None:
    """The planned peak of the stage in GiB, None for a stage the planner does not cover."""
    try:
        if stage.kind in PLANNED:
            fused = stage.kind == "eval" and Path(stage.config.model) == settings.markers / "fused"
            return planned_peak_gb(stage.kind, stage.config, settings,
                                   dense_config(settings.config) if fused else None)
        if stage.kind == "fuse":
            return fuse_report("fuse", stage.config, None, memory_gb)["peak_gb"]
    except UserError as err:
        print(f"   (no plan: {err})", file=sys.stderr)
    return None


def shown_command(stage: Stage, markers: Path) -> str:
    if stage.script is not None:
        return shlex.join(["python", *stage.script[1:]])
    if stage.kind in ("sft", "grpo"):
        return shlex.join(["wordle-mlx", *stage.command(markers), *resume_flags(stage)])
    if stage.commands:
        return " && ".join(shlex.join(["wordle-mlx", *words]) for words in stage.commands)
    return shlex.join(["wordle-mlx", *stage.command(markers)])


def duration(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 60 else f"{seconds / 60:.0f} min" if seconds < 3600 else \
        f"{seconds / 3600:.1f} h"


def describe(settings: ModelSettings, stages: list[Stage]) -> str:
    sft = [s.config for s in stages if s.kind == "sft"]
    layers = sorted({c.lora.train_layers for c in sft if c.lora.train_layers})
    checkpointed = [s.name for s in stages if s.kind in ("sft", "grpo") and s.config.model.grad_checkpoint]
    return (f"recipe for {settings.spec} ({settings.layers} blocks{f', {settings.bits}-bit' if settings.bits else ''})"
            f" in {settings.dtype}; memory budget {settings.budget_gb:.1f} GiB ({settings.budget_note}); "
            f"SFT from an adapter trains the last {', '.join(map(str, layers)) or 'all'} blocks; "
            f"gradient checkpointing: {', '.join(checkpointed) or 'none'}; stage markers in {settings.markers}/, "
            f"each stage's config written to {settings.markers}/configs/ when it starts")


def dry_run(stages: list[Stage], settings: ModelSettings, memory_gb: float | None) -> dict:
    print(describe(settings, stages))
    rates, todo, peak, total = read_rates(), 0, 0.0, 0.0
    for stage in stages:
        if is_done(settings.markers, stage.name):
            print(f"== {stage.name}: done earlier, skipped")
            continue
        todo += 1
        print(f"== {stage.name}: {shown_command(stage, settings.markers)}")
        stage_peak = stage_peak_gb(stage, settings, memory_gb)
        seconds = projected_seconds(rates, settings.spec, settings.dtype, stage)
        notes = ([f"planned peak {stage_peak:.2f} GiB"] if stage_peak is not None else []) + \
                ([f"projected {duration(seconds)} (measured here)"] if seconds is not None else [])
        if notes:
            print("   " + "; ".join(notes))
        peak = max(peak, stage_peak or 0.0)
        total += seconds or 0.0
    if total:
        print(f"projected time of the stages measured here: {duration(total)}")
    print(f"stages {todo} peak_gb {peak:.2f}")
    return {"stages": todo, "peak_gb": round(peak, 2), "projected_seconds": round(total)}
