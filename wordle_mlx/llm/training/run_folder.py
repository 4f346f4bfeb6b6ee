"""The run folder of a training run: where it lives, the config snapshot it keeps, and the trainer's arguments.

`open_run(cfg, world)` picks the folder before anything loads (rank 0 decides, every rank gets its path): the
folder `run.resume` names, or a new one under `run.logs_dir` (a folder already in the way only with
`run.overwrite`). `saved_config` is the config as the folder keeps it in `config.json` and in the metrics file's
first record: its paths relative to the run folder, so `--resume` finds them again from anywhere, and resume and
overwrite off. `training_args` reads the trainer's arguments from the training config's shared sections.
"""

from __future__ import annotations

import time
from pathlib import Path

from ...config import config_relative_path, display_path, resolve_path
from ...errors import UserError
from ...storage.fileio import remove_tree
from .distributed import World
from .trainer import TrainingArgs


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
    working folder (what `--resume` resolves them against), and resume / overwrite off. `paths` maps dotted
    config fields holding paths to their resolved path."""
    saved = cfg.model_dump(mode="json")
    saved["run"].update(resume=None, overwrite=False, name=run_dir.name,
                        logs_dir=config_relative_path(run_dir.parent, run_dir))
    for dotted, path in paths.items():
        section, key = dotted.split(".")
        saved[section][key] = config_relative_path(path, run_dir) if path is not None else None
    return saved


def training_args(cfg, run_dir: Path, adapter_config: dict, paths: dict, schedule, **extra) -> TrainingArgs:
    """The trainer's arguments from the `run`, `optimizer` and `validation` sections SFT and GRPO share (the run
    folder keeps the config as `saved_config` writes it); `extra`: the stage's own (describe, progress_text...)."""
    return TrainingArgs(
        steps=cfg.run.steps, run_dir=run_dir, adapter_config=adapter_config, config=saved_config(cfg, run_dir, paths),
        stage=cfg.STAGE, max_grad_norm=cfg.optimizer.max_grad_norm, steps_per_eval=cfg.validation.every,
        steps_per_save=cfg.run.save_every, resume=cfg.run.resume is not None, progress=cfg.run.progress,
        report_to=cfg.run.report_to, schedule=schedule, **extra)
