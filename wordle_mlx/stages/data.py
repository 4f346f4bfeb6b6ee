"""`wordle-mlx data`: synthetic SFT data from history-seeded boards and the solver as teacher.

It writes mlx-lm chat JSONL (`train.jsonl`, `valid.jsonl`: `{"messages": [...], "meta": {...}}`;
mlx-lm's ChatDataset reads only `messages`, so `mlx_lm.lora --data DIR` trains on these files as they
are). The prompt is `prompts.build_messages` for a seeded board (`history.k_weights` draws how many earlier
guesses; `game/seeding.py` with the mix `SEED_MIX`); the target is `format_reply(think, guess)` where the guess
is the teacher's, the best-splitting fitting answer (`Solver.best_candidate`), and the think text comes from
`game/thinking.py`. The teacher keeps playing from the seeded start to the end of the game and every turn is
its own example; `max_copies` caps how often one (prompt, target) example may occur (teacher games from the
empty board would otherwise fill the data with the opener board). Secrets come from the fixed split (train for
train, valid for valid; never test: asserted), every record is replayed through the engine before anything is
written (`replay_problem` of `llm/training/sft_data.py`), and `stats.json` records counts, the history-length
histogram, target length and the replay check. Output depends only on the config and the seed.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
from pydantic import Field, model_validator

from ..config import StrictModel, display_path, resolve_path
from ..errors import UserError
from ..storage.fileio import write_json_atomic, write_text_atomic
from ..game.feedback import feedback
from ..game.seeding import HistoryPolicy, seed_history
from ..game.solver import Solver
from ..game.splits import split_answers
from ..game.state import MAX_GUESSES
from ..game.thinking import ThinkStyle, think_text
from ..game.words import BUILTIN_LISTS
from ..llm.model.models import tokenizer_for
from ..llm.play.prompts import NOT_FIVE_LETTERS, PromptConfig, TurnText, build_messages, format_reply
from ..llm.training.sft_data import invalid_reply, replay_problem
from ..runtime.progress import console, progress_bar
from .pattern_table import load_table


# how seeded guesses are chosen (`seeding.HistoryPolicy`): solver, random and mistake shares, openers drawn from
SEED_MIX = {"solver": 0.3, "random": 0.55, "mistake": 0.15, "opener_top": 50}


class HistoryConfig(StrictModel):
    """The seeded boards: P(k seeded guesses); the ways to choose them are `SEED_MIX`."""
    k_weights: list[float] = Field([0.5, 0.2, 0.15, 0.1, 0.05], description="P(k seeded guesses), k = 0, 1, ...")

    @model_validator(mode="after")
    def _valid_policy(self) -> "HistoryConfig":
        self.policy()   # HistoryPolicy's own checks; its ValueError becomes a one-line config error
        return self

    def policy(self) -> HistoryPolicy:
        return HistoryPolicy(tuple(self.k_weights), **SEED_MIX)


class DataConfig(StrictModel):
    out: str = Field("data/sft", description="Output folder (relative to the config file, or to the working "
                     "folder without one).")
    seed: int = Field(0, description="Secrets, seeded boards and retry examples.")
    train_examples: int = Field(10000, ge=1, description="Seeded examples in train.jsonl.")
    valid_examples: int = Field(300, ge=1, description="Seeded examples in valid.jsonl.")
    think_style: ThinkStyle = Field("none", description="Reasoning written before the guess: none, brief, pattern "
                                    "or full (`game/thinking.py`).")
    retry_fraction: float = Field(0.1, ge=0, le=1, description="Share of examples whose prompt reports an "
                                  "invalid previous reply (as the game engine does), so the model learns to recover.")
    max_copies: int | None = Field(100, ge=1, description="Keep at most this many copies of one (prompt, "
                                   "target) example; None keeps all. Teacher games from the empty board repeat "
                                   "the same early boards for every secret (the opener board every time).")
    empty_board_copies: int = Field(0, ge=0, description="SFT: also add every distinct example of the teacher's "
                                    "games from the empty board over the split's secrets (the boards a greedy player "
                                    "meets), each this many times, on top of the seeded examples.")
    empty_board_traffic_cap: int | None = Field(None, ge=1, description="SFT: weight each of those examples by "
                                                "its traffic, the number of the split's secrets whose game passes "
                                                "through it, capped here: empty_board_copies x min(traffic, cap) "
                                                "copies. None: every board empty_board_copies times.")
    history: HistoryConfig = Field(default_factory=HistoryConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    answers_list: str = Field("answers", description="'answers' or a word-list file.")
    allowed_list: str = Field("allowed", description="'allowed', 'nyt' or a word-list file.")
    tokenizer: str | None = Field(None, description="Model spec whose tokenizer counts target tokens.")
    progress: bool = Field(True, description="Show progress bars.")

    @model_validator(mode="after")
    def _think_matches_prompt(self) -> "DataConfig":
        if self.think_style == "none" and self.prompt.require_think:
            raise ValueError("think_style 'none' needs prompt.require_think false (targets would lack <think>)")
        if self.retry_fraction > 0 and self.prompt.context != "summary":
            raise ValueError("retry_fraction > 0 needs prompt.context 'summary' (the error is noted in the state)")
        return self


def retry_note(kind: str, guess: str) -> str:
    """The think text's first sentence after an invalid reply: 'adet is not 5 letters.' / 'iceel is not a word.'"""
    return f"{guess} is not 5 letters." if kind == NOT_FIVE_LETTERS else f"{guess} is not a word."


def secret_stream(words: list[str], rng: random.Random):
    """Secrets in shuffled passes over `words`, so every word is used about equally often."""
    while True:
        order = list(words)
        rng.shuffle(order)
        yield from order


def sft_examples(secret: str, cfg: DataConfig, rng: random.Random, solver: Solver, policy: HistoryPolicy,
                 empty_board: bool = False) -> list[dict]:
    """One seeded start for `secret` (or the empty board), then the teacher's turns to the end of the game, one
    example each."""
    seeded, mode = ([], "empty") if empty_board else seed_history(secret, rng, solver, policy)
    guesses = list(seeded)
    turns: list[TurnText] = []
    out = []
    while len(guesses) < MAX_GUESSES and secret not in guesses:
        history = [(g, feedback(g, secret)) for g in guesses]
        cols = solver.candidate_columns(history)
        guess = solver.best_candidate(cols)
        cands = [solver.table.answers[c] for c in cols]
        think = think_text(history, cands, guess, cfg.think_style)
        retry = None
        if cfg.retry_fraction and rng.random() < cfg.retry_fraction:
            retry = invalid_reply(rng, solver.table)
        if retry is not None and think is not None:   # name the rejected word first, so the retry's text differs
            think = f"{retry_note(*retry)} {think}"
        reply = format_reply(think, guess, cfg.prompt.guess_format)
        messages = build_messages(cfg.prompt, history, turns, MAX_GUESSES, last_error=retry)
        messages.append({"role": "assistant", "content": reply})
        meta = {"secret": secret, "history": list(guesses), "seeded": len(seeded), "mode": mode, "target": guess}
        if retry is not None:
            meta["retry_error"] = list(retry)
        out.append({"messages": messages, "meta": meta})
        turns.append(TurnText(reply=reply, guess=guess, pattern=feedback(guess, secret)))
        guesses.append(guess)
    return out


def make_split(split: str, n: int, cfg: DataConfig, solver: Solver, splits: dict[str, list[str]]) -> list[dict]:
    rng = random.Random(f"wordle-mlx-data|{cfg.seed}|{split}")
    policy = cfg.history.policy()
    words = sorted(splits[split])
    assert not set(words) & set(splits["test"]), "train/valid secrets overlap the test split"
    secrets = secret_stream(words, rng)
    records: list[dict] = []
    copies: Counter = Counter()
    idle = 0                  # games in a row that added nothing (every example already at max_copies)
    with progress_bar(f"sft {split}", n, enabled=cfg.progress) as advance:
        while len(records) < n:
            secret = next(secrets)
            new = sft_examples(secret, cfg, rng, solver, policy)
            if cfg.max_copies is not None:
                keys = [json.dumps(r["messages"]) for r in new]
                copies.update(keys)
                new = [r for r, key in zip(new, keys) if copies[key] <= cfg.max_copies]
            new = new[: n - len(records)]
            idle = 0 if new else idle + 1
            if idle > 10 * len(words):
                raise UserError(f"data: max_copies {cfg.max_copies} leaves fewer than the {n} {split} examples "
                                f"asked for (got {len(records)}); lower {split}_examples or raise max_copies")
            records.extend(new)
            advance(len(new))
    if cfg.empty_board_copies:
        records.extend(empty_board_examples(words, cfg, rng, solver))
        rng.shuffle(records)
    return records


def empty_board_examples(words: list[str], cfg: DataConfig, rng: random.Random, solver: Solver) -> list[dict]:
    """The teacher's games from the empty board for all of `words`, each distinct example (board and
    reply) `empty_board_copies` times: the opener board, which every game shares, as often as a late board
    that one secret reaches. With `empty_board_traffic_cap`, each appears empty_board_copies x
    min(traffic, cap) times instead, traffic being how many secrets' games pass through it: the boards
    that gate many games (the second boards) weigh more than a late board one secret reaches. Its meta
    names the first secret that reached it."""
    whole_games = cfg.model_copy(update={"retry_fraction": 0.0})
    distinct: dict[str, dict] = {}
    traffic: Counter = Counter()
    for secret in words:
        for record in sft_examples(secret, whole_games, rng, solver, cfg.history.policy(), True):
            key = json.dumps(record["messages"])
            distinct.setdefault(key, record)
            traffic[key] += 1
    cap = cfg.empty_board_traffic_cap
    return [record for key, record in distinct.items()
            for _ in range(cfg.empty_board_copies * (1 if cap is None else min(traffic[key], cap)))]


def target_token_counts(records: list[dict], cfg: DataConfig) -> tuple[list[int], str]:
    """Assistant-target lengths in tokens (real with a tokenizer, else characters/4) and how they were counted."""
    if cfg.tokenizer is None:
        return [max(1, round(len(r["messages"][-1]["content"]) / 4)) for r in records], "chars/4"
    tok = tokenizer_for(cfg.tokenizer)
    counts = []
    for r in records:
        full = tok.apply_chat_template(r["messages"], return_dict=False)
        prompt = tok.apply_chat_template(r["messages"][:-1], add_generation_prompt=True, return_dict=False)
        counts.append(len(full) - len(prompt))
    return counts, f"tokenizer {cfg.tokenizer}"


def split_stats(records: list[dict], cfg: DataConfig) -> dict:
    lengths = [len(r["meta"]["history"]) for r in records]
    modes = Counter(r["meta"]["mode"] for r in records)
    secrets = {r["meta"]["secret"] for r in records}
    hist = Counter(lengths)
    stats = {"examples": len(records), "distinct_secrets": len(secrets),
             "history_length_histogram": {str(k): hist.get(k, 0) for k in range(max(lengths) + 1)},
             "modes": dict(sorted(modes.items()))}
    counts, how = target_token_counts(records, cfg)
    stats["mean_target_tokens"] = round(float(np.mean(counts)), 2)
    stats["target_tokens_counted_by"] = how
    stats["distinct_prompts"] = len({json.dumps(r["messages"][:-1]) for r in records})
    stats["distinct_examples"] = len({json.dumps(r["messages"]) for r in records})
    stats["retry_examples"] = sum("retry_error" in r["meta"] for r in records)
    return stats


def word_list_spec(cfg: DataConfig, spec: str) -> str:
    """A builtin list name as is; a file path resolved against the config file's folder."""
    return spec if spec in BUILTIN_LISTS else str(resolve_path(cfg, spec))


def run(cfg: DataConfig) -> dict:
    out = resolve_path(cfg, cfg.out).resolve()
    table = load_table(word_list_spec(cfg, cfg.answers_list), word_list_spec(cfg, cfg.allowed_list),
                       show_progress=cfg.progress)
    solver = Solver(table)
    splits = split_answers(table.answers)
    split_sets = {name: set(words) for name, words in splits.items()}
    allowed = set(table.guesses)
    sizes = {"train": cfg.train_examples, "valid": cfg.valid_examples}
    data = {split: make_split(split, n, cfg, solver, splits) for split, n in sizes.items()}

    problems = []
    for split, records in data.items():
        for i, record in enumerate(records, start=1):
            problem = replay_problem(record, cfg.prompt, allowed, split, split_sets)
            if problem:
                problems.append(f"{split} record {i}: {problem}")
    if problems:  # a bug in generation, not bad input: never write such data
        raise AssertionError(f"{len(problems)} records failed the replay check; first: {problems[0]}")

    for split, records in data.items():
        write_text_atomic(out / f"{split}.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    stats = {"mode": "sft", "seed": cfg.seed, "think_style": cfg.think_style,
             "prompt": cfg.prompt.model_dump(), "history": {**cfg.history.model_dump(), **SEED_MIX},
             "split_sizes": {name: len(words) for name, words in splits.items()},
             "replay_check": {"records": sum(len(r) for r in data.values()), "passed": sum(len(r) for r in data.values())},
             **{split: split_stats(records, cfg) for split, records in data.items()}}
    write_json_atomic(out / "stats.json", stats)
    if cfg.progress:
        console.print(f"wrote {len(data['train'])} train + {len(data['valid'])} valid SFT records to "
                      f"{display_path(out)}")
    return {"out": display_path(out), **stats}
