"""Read a run's `metrics.jsonl` or an eval JSON into plain data for the charts (format: docs/METRICS.md).

`load_run(path)` streams the JSONL with `metrics.read_jsonl` and keeps only what the charts use: per
record its step, the known numeric fields, reward components as (mean, std), and every game reduced to
an outcome (guesses used for a win, 0 for a loss). Steps are `train` and `valid` records for SFT and GRPO alike;
older SFT files wrote `sft` and `sft_valid`, read as `train` and `valid` (`storage.metrics.record_kind`), so old
and new files plot the same, and the run record's `stage` tells an SFT run from a GRPO one. Unknown kinds and
fields are ignored; a known field with the wrong type is a `UserError` naming the file, line and field. A `run` record with
`resumed_from_step: S` drops earlier step records after S (the resumed run writes them again).
`load_eval(path)` and `load_series(path)` build the per-input `Series` of `plot --compare`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import read_json_file
from ..errors import UserError
from ..storage.metrics import OLD_KINDS, read_jsonl, record_kind
from .stats import HISTOGRAM_KEYS, mean_guesses_on_wins, outcome_histogram, weighted_mean

STEP_KINDS = ("train", "valid")
NUMERIC_FIELDS = {   # GRPO's and SFT's (tokens, tokens_per_second; val_loss)
    "train": ("lr", "loss", "kl", "grad_norm", "reward_mean", "reward_std", "win_rate", "mean_guesses",
              "format_error_rate", "invalid_rate", "repeat_rate", "skipped_group_share", "tokens", "tokens_per_second"),
    "valid": ("val_loss", "win_rate", "win_rate_empty", "win_rate_seeded", "mean_guesses", "format_error_rate",
              "invalid_rate", "repeat_rate"),
}
RATE_FIELDS = ("format_error_rate", "invalid_rate", "repeat_rate")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_games(games: Any, where: str) -> list[int]:
    """Outcomes of a `games` list: guesses used for a win (1-6), 0 for a loss."""
    if not isinstance(games, list):
        raise UserError(f"{where}: 'games' should be a list, got {type(games).__name__}")
    outcomes = []
    for i, game in enumerate(games):
        if not isinstance(game, dict):
            raise UserError(f"{where}: games[{i}] should be an object, got {type(game).__name__}")
        won, guesses = game.get("won"), game.get("guesses")
        if not isinstance(won, bool):
            raise UserError(f"{where}: games[{i}].won should be true or false, got {json.dumps(won)}")
        if not isinstance(guesses, list):
            raise UserError(f"{where}: games[{i}].guesses should be a list, got {json.dumps(guesses)[:40]}")
        if won and not 1 <= len(guesses) <= 6:
            raise UserError(f"{where}: games[{i}] is won in {len(guesses)} guesses (expected 1-6)")
        outcomes.append(len(guesses) if won else 0)
    return outcomes


def _step_record(kind: str, record: dict, where: str) -> dict:
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        raise UserError(f"{where}: {record.get('kind')} record needs an integer 'step', got {json.dumps(step)}")
    kept: dict[str, Any] = {"step": step, "line": where}
    for name in NUMERIC_FIELDS[kind]:
        value = record.get(name)
        if value is not None and not _is_number(value):
            raise UserError(f"{where}: field {name!r} should be a number or null, got {json.dumps(value)[:40]}")
        kept[name] = value
    if "games" in record and record["games"] is not None:
        kept["games"] = parse_games(record["games"], where)
    rewards = record.get("rewards")
    if kind == "train" and rewards is not None:
        if not isinstance(rewards, dict):
            raise UserError(f"{where}: 'rewards' should be an object, got {type(rewards).__name__}")
        kept["rewards"] = {}
        for name, stats in rewards.items():
            mean, std = (stats.get("mean"), stats.get("std")) if isinstance(stats, dict) else (stats, None)
            for label, value in (("mean", mean), ("std", std)):
                if value is not None and not _is_number(value):
                    raise UserError(f"{where}: rewards.{name}.{label} should be a number, got {json.dumps(value)[:40]}")
            kept["rewards"][str(name)] = (mean, std)
    return kept


@dataclass
class RunLog:
    """The chartable content of one metrics.jsonl."""

    path: Path
    name: str | None = None
    config_hash: str | None = None
    decode: str | None = None             # the run's decoding mode (GRPO runs record it)
    stage: str | None = None              # "sft" or "grpo", from the run record (an old SFT file: its kinds)
    resumes: int = 0
    records: dict[str, list[dict]] = field(default_factory=lambda: {kind: [] for kind in STEP_KINDS})

    def outcomes(self, kind: str) -> list[int]:
        return [o for rec in self.records[kind] for o in rec.get("games", [])]

    def train_outcomes(self) -> list[int]:
        return self.outcomes("train")

    def valid_outcomes(self) -> list[int]:
        """Validation games: GRPO's validation passes, or SFT's quick game evals."""
        return self.outcomes("valid")

    @property
    def is_sft(self) -> bool:
        """An SFT run: its run record says so; without one, its steps carry SFT's fields (tokens/s, val_loss)."""
        if self.stage is not None:
            return self.stage == "sft"
        return (any(rec.get("tokens_per_second") is not None for rec in self.records["train"])
                or any(rec.get("val_loss") is not None for rec in self.records["valid"]))

    def series(self, kind: str, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a numeric field, skipping records where it is missing or null."""
        pairs = [(rec["step"], rec[name]) for rec in self.records[kind] if rec.get(name) is not None]
        return [s for s, _ in pairs], [float(v) for _, v in pairs]

    def reward_components(self) -> dict[str, tuple[list[int], list[float], list[float | None]]]:
        """{component: (steps, means, stds)} in first-seen order."""
        out: dict[str, tuple[list[int], list[float], list[float | None]]] = {}
        for rec in self.records["train"]:
            for name, (mean, std) in rec.get("rewards", {}).items():
                if mean is None:
                    continue
                steps, means, stds = out.setdefault(name, ([], [], []))
                steps.append(rec["step"])
                means.append(float(mean))
                stds.append(None if std is None else float(std))
        return out

    def footnote(self) -> str:
        name = self.name or self.path.parent.name
        parts = [f"run {name}", f"config {self.config_hash or 'unknown'}"]
        if self.decode:
            parts.append(f"{self.decode} decoding")
        if self.resumes:
            parts.append(f"resumed {self.resumes}x")
        return "  |  ".join(parts + [str(self.path)])

    def has_steps(self) -> bool:
        return any(self.records[kind] for kind in STEP_KINDS)


def load_run(path: str | Path) -> RunLog:
    """Read a metrics.jsonl (see module docstring); an empty file or one with no steps is a UserError."""
    path = Path(path)
    log = RunLog(path=path)
    kinds_seen: list[str] = []
    for lineno, record in read_jsonl(path):
        where = f"{path}:{lineno}"
        kind = record.get("kind")
        kinds_seen.append(str(kind))
        if kind == "run":
            log.name = log.name or _opt_str(record.get("run"))
            log.config_hash = _opt_str(record.get("config_hash")) or log.config_hash
            log.decode = _opt_str(record.get("decode")) or log.decode
            log.stage = log.stage or _opt_str(record.get("stage"))
            resumed = record.get("resumed_from_step")
            if resumed is not None:
                if not isinstance(resumed, int) or isinstance(resumed, bool):
                    raise UserError(f"{where}: 'resumed_from_step' should be an integer, got {json.dumps(resumed)}")
                log.resumes += 1
                for kind_records in log.records.values():
                    kind_records[:] = [rec for rec in kind_records if rec["step"] <= resumed]
        elif record_kind(record) in STEP_KINDS:
            if kind in OLD_KINDS:       # only SFT wrote these
                log.stage = log.stage or "sft"
            step_kind = record_kind(record)
            log.records[step_kind].append(_step_record(step_kind, record, where))
    if not kinds_seen:
        raise UserError(f"{path}: file is empty, nothing to plot")
    if not log.has_steps():
        found = ", ".join(sorted(set(kinds_seen)))
        raise UserError(f"{path}: no games or training steps to plot (record kinds found: {found})")
    return log


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass
class Series:
    """One input of `plot --compare`: its games (outcomes) and headline numbers."""

    label: str
    histogram: dict[str, int]
    outcomes: list[int] | None = None
    rates: dict[str, float | None] = field(default_factory=dict)
    footnote: str = ""
    baseline_of: str | None = None  # for a baseline: the label of the eval it came from
    secrets: list[str] | None = None  # the secret of each game, when the input records them (eval results)

    @property
    def games(self) -> int:
        return sum(self.histogram.get(k, 0) for k in HISTOGRAM_KEYS)

    @property
    def wins(self) -> int:
        return self.games - self.histogram.get("lost", 0)

    def row(self) -> dict:
        return {"label": self.label, "games": self.games, "wins": self.wins,
                "mean_guesses": mean_guesses_on_wins(self.histogram), **self.rates}


def series_from_eval(data: dict, label: str, where: str) -> Series:
    """A Series from an eval result object (the top level or one of its `baselines`)."""
    records = data.get("game_records")
    if records:
        outcomes = parse_games(records, f"{where}: game_records")
        histogram = outcome_histogram(outcomes)
    else:
        outcomes = None
        histogram = data.get("histogram")
        if not isinstance(histogram, dict) or not histogram:
            raise UserError(f"{where}: no games (neither 'game_records' nor 'histogram')")
        for key in HISTOGRAM_KEYS:
            value = histogram.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"{where}: histogram[{key!r}] should be a count, got {json.dumps(value)}")
        histogram = {key: histogram.get(key, 0) for key in HISTOGRAM_KEYS}
    if sum(histogram.values()) == 0:
        raise UserError(f"{where}: no games")
    rates = {}
    for name in RATE_FIELDS:
        value = data.get(name)
        if value is not None and not _is_number(value):
            raise UserError(f"{where}: field {name!r} should be a number or null, got {json.dumps(value)[:40]}")
        rates[name] = value
    model = data.get("model") or "model?"
    adapter = data.get("adapter")
    note = f"{model} + {adapter}" if adapter else str(model)
    if "decode" in data or "constrain" in data:     # eval JSONs say how replies were decoded
        note += f", {data.get('decode') or ('words' if data.get('constrain') else 'free')} decoding"
    secrets = [g.get("secret") for g in records] if records else None
    if secrets is not None and not all(isinstance(x, str) for x in secrets):
        secrets = None
    return Series(label=label, histogram=histogram, outcomes=outcomes, rates=rates, footnote=note, secrets=secrets)


def series_from_run(log: RunLog, label: str | None) -> Series:
    """Its validation games (all passes, in order), or its train games when it has no validation games."""
    kind = "valid" if log.valid_outcomes() else "train"
    outcomes = log.outcomes(kind)
    if not outcomes:
        raise UserError(f"{log.path}: no games to compare (no 'games' in train or valid records)")
    used = [rec for rec in log.records[kind] if rec.get("games")]
    rates = {name: weighted_mean([rec.get(name) for rec in used], [len(rec["games"]) for rec in used])
             for name in RATE_FIELDS}
    which = f"{'SFT ' if log.is_sft else ''}{'validation' if kind == 'valid' else 'train'} games"
    name = log.name or log.path.parent.name
    return Series(label=label or name, histogram=outcome_histogram(outcomes), outcomes=outcomes, rates=rates,
                  footnote=f"run {name}, config {log.config_hash or 'unknown'} ({which})")


def read_eval_or_none(path: Path) -> dict | None:
    """The eval JSON object at `path`, or None when the file is a metrics JSONL instead."""
    if path.suffix == ".jsonl":
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return read_json_file(path)  # raises the right one-line UserError
    if not text.strip():
        raise UserError(f"{path}: file is empty, nothing to plot")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None  # several JSON lines: treat as metrics JSONL (which reports bad lines by number)
    if isinstance(data, dict) and data.get("kind") == "eval":
        return data
    if isinstance(data, dict) and data.get("kind") in ("run", *STEP_KINDS, *OLD_KINDS):
        return None
    raise UserError(f"{path}: expected an eval JSON (\"kind\": \"eval\") or a metrics.jsonl, "
                    f"got {'kind ' + json.dumps(data.get('kind')) if isinstance(data, dict) else type(data).__name__}")


def load_series(path: str | Path, label: str | None, with_baselines: bool) -> list[Series]:
    """The Series of one compare input (plus its baselines when asked and present)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: file not found")
    data = read_eval_or_none(path)
    if data is None:
        return [series_from_run(load_run(path), label)]
    main = series_from_eval(data, label or _eval_label(data, path), str(path))
    out = [main]
    baselines = data.get("baselines") if with_baselines else None
    if isinstance(baselines, dict):
        for name, result in baselines.items():
            if isinstance(result, dict) and result.get("same_as_model"):
                continue  # the eval's own model (no adapter): already the main series
            if isinstance(result, dict) and (result.get("game_records") or result.get("histogram")):
                baseline = series_from_eval(result, f"{name} (baseline)", f"{path}: baselines.{name}")
                baseline.baseline_of = main.label
                baseline.footnote = ""  # its source is the eval above
                out.append(baseline)
    return out


def _eval_label(data: dict, path: Path) -> str:
    adapter = data.get("adapter")
    return Path(str(adapter)).name if adapter else str(data.get("model") or path.stem)
