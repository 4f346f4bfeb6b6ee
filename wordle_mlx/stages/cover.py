"""`wordle-mlx data cover`: add answer-coverage examples to an SFT data folder, so the model learns to name
every answer.

A 270M model that has narrowed a held-out game to one answer may not be able to spell it (it ends on a non-word
with only the secret left), while words that some training board used as a label it spells. This stage reads a
bare-guess SFT data folder (`data self-play` or `data` output with context `summary`), takes the boards of its
train records, and for every answer word adds one example (`copies` times) on the board where that word fits the
clues with the fewest other answers, as a guess that is not the secret (`game/coverage.py`), optionally only on
boards with at most `max_candidates` fitting answers. Every answer is treated alike; the secrets stay the folder's
train secrets, so no test word is ever a secret. The train records and the new ones are shuffled together; valid
records are copied as they are. Everything passes `data`'s replay check before the folder is written (atomically).
What it changes in held-out play: docs/RESULTS.md ("Coverage labels").
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import numpy as np
from pydantic import Field

from ..config import StrictModel, display_path, read_json_file, resolve_path
from ..errors import UserError
from ..game.coverage import coverage_examples
from ..game.feedback import feedback
from ..game.solver import Solver
from ..game.splits import split_answers
from ..game.state import MAX_GUESSES
from ..llm.play.prompts import PromptConfig, build_messages, format_reply
from ..runtime.progress import console
from ..llm.training.sft_data import read_sft_jsonl, write_checked_sft
from .pattern_table import load_table


class CoverConfig(StrictModel):
    data: str = Field("data/self-play", description="Input SFT data folder (train.jsonl, valid.jsonl, stats.json).")
    out: str = Field("data/cover", description="Output folder: the input's records plus the coverage examples.")
    copies: int = Field(4, ge=1, le=16, description="Times each coverage example appears (as self-play repeats "
                        "its busy boards); a board's tight spots are few, so this is how a word is said more often.")
    max_candidates: int | None = Field(5, ge=2, description=(
        "Only boards on which at most this many answers fit (None: any board, down to the empty one); labels on "
        "broad boards teach early guesses too."))
    seed: int = Field(0, ge=0, lt=2 ** 32, description="Shuffle of the merged train records.")
    progress: bool = Field(True, description="Show progress.")


def read_folder(folder: Path) -> tuple[list[dict], list[dict], dict]:
    """(train records, valid records or [], stats) of an SFT data folder; one-line errors for what is missing."""
    for name in ("train.jsonl", "stats.json"):
        if not (folder / name).is_file():
            raise UserError(f"cover: data {folder}: no {name} there (expected a `data` or `data self-play` output folder)")
    valid = read_sft_jsonl(folder / "valid.jsonl") if (folder / "valid.jsonl").is_file() else []
    stats = read_json_file(folder / "stats.json")
    if not isinstance(stats, dict) or not isinstance(stats.get("prompt"), dict):
        raise UserError(f"cover: {folder / 'stats.json'}: no prompt object (expected a `data` or `data self-play` output)")
    return read_sft_jsonl(folder / "train.jsonl"), valid, stats


def run(cfg: CoverConfig) -> dict:
    t0 = time.monotonic()
    # relative to the working folder when inside it, as messages and stats.json name them
    src, out = (Path(display_path(resolve_path(cfg, p).resolve())) for p in (cfg.data, cfg.out))
    if src == out:
        raise UserError(f"cover: out {out} is the input folder; write the covered data to a new folder")
    train, valid, stats = read_folder(src)
    prompt = PromptConfig(**stats["prompt"])
    if prompt.context != "summary" or prompt.require_think:
        raise UserError(f"cover: {src / 'stats.json'}: prompt must have context 'summary' and require_think false "
                        f"(got {prompt.context!r}, {prompt.require_think}): coverage labels are bare guesses")
    solver = Solver(load_table(show_progress=cfg.progress))
    splits = split_answers(solver.table.answers)
    boards = []
    for i, r in enumerate(train, 1):
        meta = r.get("meta")
        if not (isinstance(meta, dict) and isinstance(meta.get("secret"), str)
                and isinstance(meta.get("history"), list)):
            raise UserError(f"cover: {src / 'train.jsonl'} record {i}: no meta.secret and meta.history (needs "
                            "`data` or `data self-play` output)")
        boards.append((meta["secret"], meta["history"]))
    if any(secret in splits["test"] for secret, _ in boards):
        raise UserError(f"cover: {src / 'train.jsonl'} has a test secret; refusing to build on it")
    examples, uncovered = coverage_examples(boards, solver.table.answers, solver, cfg.max_candidates)
    records = []
    for ex in examples:
        history = [(g, feedback(g, ex.secret)) for g in ex.history]
        messages = build_messages(prompt, history, (), MAX_GUESSES) + [
            {"role": "assistant", "content": format_reply(None, ex.word, prompt.guess_format)}]
        records.append({"messages": messages, "meta": {
            "secret": ex.secret, "history": list(ex.history), "seeded": 0, "mode": "answer_coverage",
            "target": ex.word, "candidates": ex.candidates}})
    merged = train + records * cfg.copies
    random.Random(f"wordle-mlx-cover|{cfg.seed}").shuffle(merged)
    sizes = np.array([ex.candidates for ex in examples]) if examples else np.zeros(1)
    test = set(splits["test"])
    stats = {**stats, "coverage": {
        "input": str(src), "copies": cfg.copies, "max_candidates": cfg.max_candidates,
        "seed": cfg.seed, "examples": len(records), "records_added": len(records) * cfg.copies,
        "input_train_records": len(train), "words_covered": len({ex.word for ex in examples}),
        "uncovered_words": uncovered, "test_words_as_labels": len({ex.word for ex in examples} & test),
        "candidates_median": float(np.median(sizes)), "candidates_max": int(sizes.max()),
        "candidates_histogram": dict(sorted(Counter(
            "2" if n <= 2 else "3-5" if n <= 5 else "6-20" if n <= 20 else ">20" for n in sizes.tolist()).items())),
        "seconds": round(time.monotonic() - t0, 1)}}
    split_sets = {name: set(words) for name, words in splits.items()}
    data = {"train": merged, **({"valid": valid} if valid else {})}
    write_checked_sft(out, data, stats, prompt, set(solver.table.guesses), split_sets)
    c = stats["coverage"]
    if cfg.progress:
        console.print(f"cover: {c['examples']} coverage examples for {c['words_covered']} answer words "
                      f"(median {c['candidates_median']:g} fitting answers a board), {len(merged)} train records "
                      f"in {out}")
    return {"out": str(out), **c}
