"""SFT data: mlx-lm's chat JSONL records, made by `data`, `data self-play` and `data cover`, read by `sft`.

A record is `{"messages": [system?, user, assistant, ..., assistant], "meta": {...}}`: the prompt of a board
(`prompts.build_messages`) and the target reply last; mlx-lm's ChatDataset reads only `messages`. The stages that
make data share three things here: `invalid_reply`, a made-up invalid earlier reply for the retry examples;
`replay_problem`, the check that a record replays through the game engine (its secret in the right split and never
a test word, its earlier replies parsing to its history, its prompt rebuilt from the board, its target a new
fitting guess); and `write_checked_sft`, which replay-checks every record and only then writes each split's
JSONL and stats.json atomically. `read_sft_jsonl` reads a split back, refusing a record with the wrong schema
with a one-line error naming its line. No mlx here: the data stages import it without loading a model.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from ...errors import UserError
from ...game.entropy import PatternTable
from ...game.feedback import feedback
from ...game.state import MAX_GUESSES
from ...storage.fileio import write_json_atomic, write_text_atomic
from ...storage.metrics import read_jsonl
from ..play.prompts import (NOT_A_WORD, NOT_FIVE_LETTERS, REPLY_ERRORS, PromptConfig, TurnText, build_messages,
                            parse_reply)

ROLES = ("system", "user", "assistant")


def invalid_reply(rng: random.Random, table: PatternTable) -> tuple[str, str]:
    """A made-up invalid earlier reply (error kind, guess), the kinds a small model makes: a four- or
    six-letter word, or five letters that are not a word. Built from a random allowed word, never from the
    example's target, so the error message carries no hint of the answer."""
    word = rng.choice(table.guesses)
    kind = rng.random()
    if kind < 0.4:
        return NOT_FIVE_LETTERS, word[:4]
    if kind < 0.6:
        return NOT_FIVE_LETTERS, word + rng.choice("sdy")
    while True:
        letters = list(word)
        rng.shuffle(letters)
        if "".join(letters) not in table.guess_index:
            return NOT_A_WORD, "".join(letters)
        word = rng.choice(table.guesses)


def replay_problem(record: dict, prompt: PromptConfig, allowed: set[str], split: str,
                   splits: dict[str, set[str]]) -> str | None:
    """Why `record`, made with the prompt settings `prompt`, does not replay through the engine (None when it
    does)."""
    secret, guesses = record["meta"]["secret"], record["meta"]["history"]
    if secret in splits["test"]:
        return f"secret {secret!r} is a test word"
    if secret not in splits[split]:
        return f"secret {secret!r} is not in the {split} split"
    if secret in guesses or len(guesses) >= MAX_GUESSES:
        return "the seeded board is already over"
    if any(g not in allowed for g in guesses):
        return "history has a word that is not allowed"
    history = [(g, feedback(g, secret)) for g in guesses]
    messages = record["messages"]
    seeded = record["meta"]["seeded"]
    turns = []
    for msg, g in zip([m for m in messages[:-1] if m["role"] == "assistant"], guesses[seeded:]):
        parsed = parse_reply(msg["content"], prompt.require_think, allowed)
        if parsed.guess != g:
            return f"earlier reply plays {parsed.guess!r}, history says {g!r}"
        turns.append(TurnText(reply=msg["content"], guess=g, pattern=feedback(g, secret)))
    retry = record["meta"].get("retry_error")
    if retry is not None and retry[0] not in REPLY_ERRORS:
        return f"retry_error {retry} is not a reply error kind"
    if retry is not None and retry[0] in (NOT_A_WORD, NOT_FIVE_LETTERS) and (
            parse_reply(f"<think>x</think><guess>{retry[1]}</guess>", False, allowed).error != retry[0]):
        return f"retry_error {retry} is not the error the engine would report"
    last_error = tuple(retry) if retry is not None else None
    if build_messages(prompt, history, turns, MAX_GUESSES, last_error=last_error) != messages[:-1]:
        return "prompt does not match the board replayed against the secret"
    target = parse_reply(messages[-1]["content"], prompt.require_think, allowed)
    if target.error is not None:
        return f"target reply error {target.error}"
    if target.guess != record["meta"]["target"] or target.guess in guesses:
        return f"target guess {target.guess!r} is not the recorded new guess"
    return None


def write_checked_sft(out: Path, data: dict[str, list[dict]], stats: dict, prompt: PromptConfig,
                      allowed: set[str], splits: dict[str, set[str]], check=lambda record: True) -> None:
    """Replay-check every SFT record that `check` selects, then write each split's JSONL and stats.json
    atomically; a record that fails is a bug, and nothing is written."""
    problems = [f"{split} record {i}: {p}" for split, records in data.items() for i, r in enumerate(records, 1)
                if check(r) and (p := replay_problem(r, prompt, allowed, split, splits))]
    if problems:
        raise AssertionError(f"{len(problems)} records failed the replay check; first: {problems[0]}")
    for split, records in data.items():
        write_text_atomic(out / f"{split}.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    write_json_atomic(out / "stats.json", stats)


def read_sft_jsonl(path: str | Path) -> list[dict]:
    """Chat records from an SFT JSONL file; a record with a wrong schema is a UserError naming its line."""
    path = Path(path)
    records = []
    for lineno, record in read_jsonl(path):
        messages = record.get("messages")
        where = f"{path}:{lineno}"
        if not isinstance(messages, list) or not messages:
            raise UserError(f"{where}: expected a non-empty 'messages' list, got {json.dumps(messages)[:60]}")
        for j, msg in enumerate(messages):
            if not isinstance(msg, dict) or msg.get("role") not in ROLES or not isinstance(msg.get("content"), str):
                raise UserError(f"{where}: messages[{j}] must be {{'role': system|user|assistant, 'content': str}}, "
                                f"got {json.dumps(msg)[:60]}")
        if messages[-1]["role"] != "assistant":
            raise UserError(f"{where}: the last message must be the assistant target, got role {messages[-1]['role']!r}")
        records.append(record)
    if not records:
        raise UserError(f"{path}: no records")
    return records
