"""`wordle-mlx plan --measure`: two real steps of a stage on this machine, beside the plan.

`run(cfg)` prints the plan (`plan.run`), then `measure_stage(kind, cfg, path)` runs the stage the config
describes, shrunk to two steps, in a temporary folder (nothing of the user's is written): SFT and GRPO for 2
steps (no validation, no game eval, one checkpoint at the end), eval on at most two decoding batches of games,
self-play on 2 train and 1 valid secret. It frees MLX's cache and resets its peak counter first, so the peak
it reports is MLX's own (`mx.get_peak_memory()`) over loading and those steps, and it times the second step
(the first one compiles and warms caches) to project the whole stage: steps x seconds a step for training
(validation and checkpoints not counted), games x seconds a game for eval and self-play.
`benchmarks/gemma3_4b_size.py` uses the same runs at the 4B's real size.
"""
from __future__ import annotations

import contextlib
import gc
import io
import json
import shutil
import tempfile
import time
from pathlib import Path

import mlx.core as mx

from ..config import resolve_path
from ..planning import memory as mp
from ..game.splits import split_answers
from ..game.words import answers
from ..storage.metrics import record_kind
from . import choice, evaluate, grpo, plan, sft


def training_run(cfg, root: Path) -> tuple[float, int, str]:
    """Two steps of an SFT or GRPO config in `root` (its paths absolute; no validation, checkpoints or reports):
    the second step's seconds, the run's steps, and what one is."""
    adapter = cfg.model.adapter
    update = {"run": cfg.run.model_copy(update={"steps": 2, "save_every": 0, "resume": None, "overwrite": True,
                                                "progress": False, "logs_dir": str(root), "name": "measure",
                                                "report_to": ""}),
              "model": cfg.model.model_copy(update={"adapter": str(resolve_path(cfg, adapter)) if adapter else None}),
              "validation": cfg.validation.model_copy(update={"every": 0})}
    if cfg.STAGE == "sft":
        update["data"] = cfg.data.model_copy(update={"folder": str(resolve_path(cfg, cfg.data.folder))})
    (sft if cfg.STAGE == "sft" else grpo).run(cfg.model_copy(update=update))
    records = [json.loads(line) for line in (root / "measure" / "metrics.jsonl").read_text().splitlines()]
    second = [r for r in records if record_kind(r) == "train"][-1]
    seconds = (second["tokens"] / second["tokens_per_second"] if cfg.STAGE == "sft"
               else second["rollout_seconds"] + second["update_seconds"])
    return seconds, cfg.run.steps, "step"


def eval_run(cfg, root: Path) -> tuple[float, int, str]:

    games = min(cfg.games, 2 * cfg.rollout.completion_batch_size)
    adapter = str(resolve_path(cfg, cfg.adapter)) if cfg.adapter else None
    shrunk = cfg.model_copy(update={"games": games, "baselines": False, "out": str(root / "eval.json"),
                                    "adapter": adapter, "progress": False, "json_output": True})
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        evaluate.run(shrunk)
    return (time.perf_counter() - start) / games, cfg.games, "game"


def self_play_run(cfg, root: Path) -> tuple[float, int, str]:

    splits = split_answers(answers())
    games = (cfg.train_games or len(splits["train"])) + (cfg.valid_games or len(splits["valid"]))
    adapter = str(resolve_path(cfg, cfg.adapter)) if cfg.adapter else None
    shrunk = cfg.model_copy(update={"train_games": 2, "valid_games": 1, "out": str(root / "self-play"),
                                    "adapter": adapter, "progress": False})
    start = time.perf_counter()
    choice.run(shrunk)
    return (time.perf_counter() - start) / 3, games, "game"


RUNS = {"sft": training_run, "grpo": training_run, "eval": eval_run, "self-play": self_play_run}
WHAT = {"sft": "2 SFT steps, the second timed", "grpo": "2 GRPO steps, the second timed",
        "eval": "up to two decoding batches of games", "self-play": "3 self-play games"}


def measure_stage(kind: str, cfg, path: str, keep: str | None = None) -> dict:
    """MLX's peak over loading and two steps of the stage `cfg` (loaded from `path`), the seconds of one step
    (or game), and the projected seconds of the whole stage; `keep`: a folder to copy a training stage's
    adapter to."""
    with tempfile.TemporaryDirectory(prefix="wordle-mlx-measure-") as tmp:
        gc.collect()
        mx.clear_cache()
        mx.reset_peak_memory()
        seconds, units, unit = RUNS[kind](cfg, Path(tmp))
        peak = mx.get_peak_memory()
        if keep is not None and (Path(tmp) / "measure" / "adapters").is_dir():
            shutil.copytree(Path(tmp) / "measure" / "adapters", keep, dirs_exist_ok=True)
    gc.collect()
    mx.clear_cache()
    return {"what": WHAT[kind], "config": path, "peak_gb": round(mp.gb(peak), 3), "seconds_per_unit": seconds,
            "unit": unit, "units": units, "projected_seconds": seconds * units}


def run(cfg: plan.PlanConfig) -> dict:
    """`wordle-mlx plan --measure`: the plan, then the measured peak and the projected time beside it."""
    result = plan.run(cfg)
    kind, stage_cfg = plan.stage_config(cfg.config)
    result["measured"] = measure_stage(kind, stage_cfg, cfg.config)
    if not cfg.json_output:
        print_measured(result)
    return result


def print_measured(r: dict) -> None:
    m = r["measured"]
    error = (m["peak_gb"] - r["peak_gb"]) / m["peak_gb"] if m["peak_gb"] else 0.0
    print(f"measured on this machine ({m['what']}): peak {m['peak_gb']:.2f} GB (plan {r['peak_gb']:.2f} GB, "
          f"{error:+.0%}), {m['seconds_per_unit']:.1f} s per {m['unit']}; the whole stage ({m['units']} "
          f"{m['unit']}s): about {format_duration(m['projected_seconds'])}")


def format_duration(seconds: float) -> str:
    hours, rest = divmod(int(round(seconds)), 3600)
    return f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min {rest % 60} s"
