"""Running one recipe stage as a child process, and what the run folder keeps of it.

Each stage runs as `python -m wordle_mlx <command> --config <snapshot>` (`run_child`): fresh memory per stage,
the same code path and numbers as typing the command, its progress bars on this terminal. While a child runs,
this process does nothing on Ctrl-C (the terminal sends it to the child too, which stops after its step with a
checkpoint, as `sft` and `train` do) and passes a SIGTERM on to the child; it then exits with the child's status.
The marker folder (`logs/recipe-<tag>/`) holds `<stage>.done` with the stage's seconds, summed over interrupted
runs through `<stage>.partial`, as the shell recipe did, so a finished stage is skipped the next time and a crash
leaves the stages before it done. A training stage resumes its run folder when it has a checkpoint
(`--resume`), else starts it over (`--overwrite`). `stage_result` is the short result a finished stage prints
(loss, validation wins, eval wins). Measured rates (seconds per step or game of a stage, for a model and dtype)
are kept per host in `logs/recipe-rates.json`, so a later `--dry-run` on this machine projects times.
"""

from __future__ import annotations

import json
import platform
import signal
import subprocess
import sys
from pathlib import Path

from ..storage.fileio import write_json_atomic, write_text_atomic
from ..storage.metrics import read_jsonl, record_kind
from .recipe_build import Stage


def marker(markers: Path, name: str, suffix: str = "done") -> Path:
    return markers / f"{name}.{suffix}"


def seconds_in(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def is_done(markers: Path, name: str) -> bool:
    return marker(markers, name).is_file()


def record_end(markers: Path, name: str, seconds: float, ok: bool) -> int:
    """Write `<name>.done` (ok) or `<name>.partial` with the stage's seconds so far; returns them."""
    total = seconds_in(marker(markers, name, "partial")) + int(round(seconds))
    write_text_atomic(marker(markers, name, "done" if ok else "partial"), f"{total}\n")
    if ok:
        marker(markers, name, "partial").unlink(missing_ok=True)
    return total


def resume_flags(stage: Stage) -> list[str]:
    """`--resume RUN_DIR` when the run folder has a checkpoint, else `--overwrite`."""
    checkpoints = stage.run_dir / "checkpoints"
    return ["--resume", str(stage.run_dir)] if checkpoints.is_dir() and any(checkpoints.iterdir()) else ["--overwrite"]


def run_child(argv: list[str]) -> int:
    """Run `argv`, this process ignoring Ctrl-C and passing SIGTERM on; the child's exit status (128 + N when a
    signal N ended it)."""
    child: list[subprocess.Popen] = []

    def forward(signum, frame):
        for proc in child:
            proc.send_signal(signum)

    previous = {}
    for sig, handler in ((signal.SIGINT, lambda signum, frame: None), (signal.SIGTERM, forward)):
        if signal.getsignal(sig) is not signal.SIG_IGN:      # an ignored signal stays ignored, for the child too
            previous[sig] = signal.signal(sig, handler)
    try:
        child.append(subprocess.Popen(argv))
        status = child[0].wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - status if status < 0 else status


def stage_argv(stage: Stage, markers: Path) -> list[list[str]]:
    """The stage's command lines (several for plots)."""
    if stage.script is not None:
        return [stage.script]
    if stage.kind in ("sft", "grpo"):
        return [[sys.executable, "-m", "wordle_mlx", *stage.command(markers), *resume_flags(stage)]]
    if stage.commands:
        return [[sys.executable, "-m", "wordle_mlx", *words] for words in stage.commands]
    return [[sys.executable, "-m", "wordle_mlx", *stage.command(markers)]]


def stage_result(stage: Stage) -> str:
    """Loss and validation wins of a training run, wins of an eval, examples of a data folder ('' if none)."""
    try:
        if stage.kind in ("sft", "grpo"):
            records = [r for _, r in read_jsonl(stage.run_dir / "metrics.jsonl")]
            train = [r for r in records if record_kind(r) == "train" and "loss" in r]
            valid = [r for r in records if record_kind(r) == "valid"]
            parts = [f"loss {train[-1]['loss']:.4f}"] if train else []
            if valid and "val_loss" in valid[-1]:
                parts.append(f"val_loss {valid[-1]['val_loss']:.4f}")
            if valid and "win_rate" in valid[-1]:
                parts.append(f"validation wins {valid[-1]['win_rate']:.0%} (step {valid[-1]['step']})")
            return ", ".join(parts)
        if stage.kind == "eval":
            result = json.loads(stage.out.read_text())
            return f"wins {result['wins']} / {result['games']}"
        if stage.kind in ("data", "self-play", "cover"):
            lines = (stage.out / "train.jsonl").read_text().count("\n")
            return f"{lines} train examples in {stage.out}"
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return ""
    return ""


def rates_file() -> Path:
    return Path("logs") / "recipe-rates.json"


def rate_key(spec: str, dtype: str, name: str) -> str:
    return f"{spec}|{dtype}|{name}"


def read_rates() -> dict:
    try:
        rates = json.loads(rates_file().read_text())
    except (OSError, ValueError):
        return {}
    return rates.get(platform.node(), {}) if isinstance(rates, dict) else {}


def record_rate(spec: str, dtype: str, stage: Stage, seconds: int) -> None:
    """Keep this host's seconds per unit (step or game) of the stage, for projected times."""
    if stage.units <= 0 or seconds <= 0:
        return
    try:
        rates = json.loads(rates_file().read_text())
        rates = rates if isinstance(rates, dict) else {}
    except (OSError, ValueError):
        rates = {}
    rates.setdefault(platform.node(), {})[rate_key(spec, dtype, stage.name)] = seconds / stage.units
    try:
        write_json_atomic(rates_file(), rates)
    except OSError:
        pass                                   # a read-only cache costs only the projection


def projected_seconds(rates: dict, spec: str, dtype: str, stage: Stage) -> float | None:
    rate = rates.get(rate_key(spec, dtype, stage.name))
    return rate * stage.units if isinstance(rate, (int, float)) and stage.units else None
