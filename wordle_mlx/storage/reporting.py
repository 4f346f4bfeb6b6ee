"""Forward metrics records to TensorBoard or Weights & Biases (`--report-to`, as in mlx-lm).

`MetricsWriter(path, report_to=...)` hands every record it writes to the reporters built here, after the JSONL
line is written (the JSONL file stays the record of the run). A record of any kind but `run` is reported at step
`record["step"]`: each int or float field (nested dicts flattened with "/", lists, strings, bools and None left
out, `step` and `time` used as step and wall time) becomes the scalar `"<kind>/<field>"`. The `run` record goes
to TensorBoard as the text `run/config` (the record as JSON) and to wandb as the run's config. TensorBoard
events go to `<run folder>/tensorboard/`, written with the `tensorboard` package's own event writer (no
TensorFlow); wandb is optional, starts offline unless `WANDB_MODE` says otherwise and keeps its files in the
run folder.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterable

from ..errors import UserError

REPORT_TO_CHOICES = ("tensorboard", "wandb")
WANDB_PROJECT = "wordle-mlx"
_SKIPPED_FIELDS = ("kind", "step", "time")


def parse_report_to(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """`"tensorboard,wandb"` (or a list of names) -> `("tensorboard", "wandb")`; None or "" -> ().

    Names are stripped and lower-cased, repeats dropped; an unknown name or a missing package is a UserError.
    """
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        name = str(item).strip().lower()
        if not name:
            continue
        if name not in REPORT_TO_CHOICES:
            raise UserError(f"--report-to {name}: unknown name; choose from {', '.join(REPORT_TO_CHOICES)}")
        if name not in names:
            names.append(name)
    for name in names:
        _import(name)
    return tuple(names)


def _import(name: str):
    try:
        if name == "tensorboard":
            from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
            return EventFileWriter, event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
        import wandb
        return wandb
    except ImportError:
        raise UserError(f"--report-to {name}: {name} is not installed (pip install {name})") from None


def scalars(record: dict) -> dict[str, float]:
    """The record's reported scalars, `"<kind>/<field>"` -> value (see the module docstring)."""
    kind = str(record.get("kind", "record"))
    out: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}/{key}", sub)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[prefix] = float(value)

    for key, value in record.items():
        if key not in _SKIPPED_FIELDS:
            walk(f"{kind}/{key}", value)
    return out


def _step(record: dict) -> int | None:
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _wall_time(record: dict) -> float:
    t = record.get("time")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else time.time()


class TensorBoardReporter:
    """Scalars and the run's config as event files in `logdir`, flushed after every record."""

    def __init__(self, logdir: str | Path):
        (self._Writer, self._event_pb2, self._summary_pb2, self._tensor_pb2, self._shape_pb2,
         self._types_pb2) = _import("tensorboard")
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = self._Writer(str(self.logdir))

    def write(self, record: dict) -> None:
        summary = self._summary_pb2.Summary
        if record.get("kind") == "run":
            resumed = record.get("resumed_from_step")
            step = resumed if isinstance(resumed, int) else 0
            values = [summary.Value(tag="run/config", tensor=self._text(record), metadata=self._text_metadata())]
        else:
            step = _step(record)
            values = [summary.Value(tag=tag, simple_value=v) for tag, v in scalars(record).items()]
            if step is None or not values:
                return
        self._writer.add_event(self._event_pb2.Event(wall_time=_wall_time(record), step=step,
                                                     summary=summary(value=values)))
        self._writer.flush()

    def _text(self, record: dict):
        """The record as indented JSON, a markdown code block (what the text plugin renders)."""
        text = "    " + json.dumps(record, indent=2, sort_keys=True).replace("\n", "\n    ")
        return self._tensor_pb2.TensorProto(dtype=self._types_pb2.DT_STRING, string_val=[text.encode("utf-8")],
                                            tensor_shape=self._shape_pb2.TensorShapeProto())

    @staticmethod
    def _text_metadata():
        from tensorboard.plugins.text import metadata
        return metadata.create_summary_metadata(display_name=None, description=None)

    def close(self) -> None:
        self._writer.close()


class WandbReporter:
    """A wandb run in `run_dir` (offline unless `WANDB_MODE` is set): the run record as config, scalars per step."""

    def __init__(self, run_name: str, run_dir: str | Path):
        wandb = _import("wandb")
        self._run = wandb.init(project=WANDB_PROJECT, name=run_name, mode=os.environ.get("WANDB_MODE", "offline"),
                               dir=str(run_dir))

    def write(self, record: dict) -> None:
        if record.get("kind") == "run":
            self._run.config.update({k: v for k, v in record.items() if k != "kind"}, allow_val_change=True)
            return
        step = _step(record)
        values = scalars(record)
        if step is not None and values:
            self._run.log(values, step=step)

    def close(self) -> None:
        self._run.finish()


def make_reporters(report_to: Iterable[str], run_dir: str | Path, run_name: str) -> list:
    """One reporter per name of `report_to` (already parsed, or a comma-separated string)."""
    names = parse_report_to(report_to)
    reporters: list = []
    try:
        for name in names:
            reporters.append(TensorBoardReporter(Path(run_dir) / "tensorboard") if name == "tensorboard"
                             else WandbReporter(run_name, run_dir))
    except BaseException:
        for reporter in reporters:
            reporter.close()
        raise
    return reporters
