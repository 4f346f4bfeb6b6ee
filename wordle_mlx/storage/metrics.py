"""Append-only JSONL metrics: one JSON object per line, written and read in a streaming way.

Writers append a line and flush it (and fsync) so a killed run leaves at most one truncated last line.
Readers yield `(line_number, record)`; a truncated last line (from a run still writing) is skipped with
a warning, and any other malformed line raises a `UserError` naming the file and line number.

Record kinds used across the project (field `kind`):
- `run`: first line of a run: its `stage` (sft, grpo), run name, config hash, the config, start time.
- `train`: one step: GRPO's rewards per component, rates, timings and `games` outcomes; SFT's loss, lr, tokens/s.
- `valid`: a validation pass: the win rate and every game's secret, guesses, won; for SFT also the validation loss.
Files written before SFT used `train` / `valid` have `sft` / `sft_valid` there (`OLD_KINDS`): readers take a
record's kind from `record_kind`, which reads those as today's, so old files still plot.
With `report_to` the writer also forwards each record to TensorBoard or wandb (`storage/reporting.py`).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator

from ..errors import UserError
from .fileio import atomic_path
from .reporting import make_reporters

OLD_KINDS = {"sft": "train", "sft_valid": "valid"}      # SFT's step kinds before it wrote train / valid


def record_kind(record: dict) -> str | None:
    """The record's kind (None when it has no string kind), an old SFT kind read as today's (`OLD_KINDS`)."""
    kind = record.get("kind")
    return OLD_KINDS.get(kind, kind) if isinstance(kind, str) else None


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN/inf become None so every line is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / mlx scalars
        return _clean(value.item())
    return value


class MetricsWriter:
    """Append records to a JSONL file, one flushed line each; `report_to` also forwards them (see reporting.py).

    `report_to` is a tuple of names from `reporting.REPORT_TO_CHOICES` or a comma-separated string (empty: JSONL
    only); TensorBoard and wandb files go to the JSONL file's folder; `run_name` (default: that folder's name)
    names the wandb run.
    """

    def __init__(self, path: str | Path, report_to: Iterable[str] | str = (), run_name: str | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._reporters: list = []
        if report_to:
            try:
                self._reporters = make_reporters(report_to, self.path.parent, run_name or self.path.parent.name)
            except BaseException:
                self._fh.close()
                raise

    def write(self, record: dict) -> None:
        clean = _clean(record)
        try:
            self._fh.write(json.dumps(clean, allow_nan=False) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as exc:
            raise UserError(f"{self.path}: cannot write metrics: {exc.strerror or exc} (disk full?)") from None
        for reporter in self._reporters:
            reporter.write(clean)

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError:       # a failed write was already reported; the buffer cannot be flushed either
            pass
        reporters, self._reporters = self._reporters, []
        for reporter in reporters:
            try:
                reporter.close()
            except OSError:
                pass

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_jsonl(path: str | Path, warn=None) -> Iterator[tuple[int, dict]]:
    """Yield (line_number, record) for each line; see the module docstring for error handling."""
    path = Path(path)
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, expected a JSONL file") from None
    with fh:
        pending: tuple[int, bytes] | None = None
        for lineno, raw in enumerate(fh, start=1):
            if pending is not None:
                yield _parse(path, *pending, last=False)
                pending = None
            if not raw.strip():
                continue
            pending = (lineno, raw)
        if pending is not None:
            lineno, raw = pending
            if not raw.endswith(b"\n"):
                try:
                    record = _parse(path, lineno, raw, last=False)
                except UserError:
                    warn(f"{path}:{lineno}: skipping truncated last line")
                    return
                yield record
            else:
                yield _parse(path, lineno, raw, last=True)


def _parse(path: Path, lineno: int, raw: bytes, last: bool) -> tuple[int, dict]:
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{path}:{lineno}: not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UserError(f"{path}:{lineno}: invalid JSON: {getattr(exc, 'msg', 'too deeply nested')}") from None
    if not isinstance(record, dict):
        raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
    return lineno, record


def truncate_after_step(path: str | Path, step: int) -> int:
    """Drop records logged after `step` (from a run killed after its last checkpoint); returns how many.

    Called on resume, before the resumed run appends, so the file never holds a step twice. `run`
    records and records without a step are kept; a truncated last line is dropped. Atomic rewrite.
    """

    path = Path(path)
    if not path.exists():
        return 0
    kept: list[str] = []
    dropped = 0
    for _, record in read_jsonl(path, warn=lambda msg: None):
        rec_step = record.get("step")
        if record.get("kind") != "run" and isinstance(rec_step, int) and rec_step > step:
            dropped += 1
            continue
        kept.append(json.dumps(record))
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    return dropped
