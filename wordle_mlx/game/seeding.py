"""Seeded game histories: a few earlier guesses put on the board before the model (or teacher) plays.

`seed_history(secret, rng, solver, policy)` returns `(guesses, mode)`. The number of guesses k is drawn
from `policy.k_weights` (P(k) for k = 0, 1, ...); the way they are chosen (`mode`) is drawn from the
weights `solver`, `random` and `mistake`: "solver" plays the solver's best guess for the board so far,
"random" plays a random answer word still consistent with the feedback so far, "mistake" plays random
consistent words except for one random allowed word that need not fit the feedback (a board with an
error on it). In every mode the first guess is a random one of the `opener_top` best openers by
entropy, so boards differ; k = 0 gives mode "empty". The secret is never drawn, so the board is never
over before play starts; drawing stops early when only the secret is left. The result depends only on
the arguments and the rng state: `history_rng(seed, secret)` gives each (seed, secret) its own
reproducible history, independent of the other games, and `eval_board(secret, seed, solver)` is the board
`wordle-mlx eval --history seeded --seed S` (and GRPO's seeded validation, at seed 0) plays. Used by
`wordle-mlx data` too. Pure Python/numpy, no mlx.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from .solver import Solver

MODES = ("solver", "random", "mistake")


@dataclass(frozen=True)
class HistoryPolicy:
    k_weights: tuple[float, ...] = (0.2, 0.2, 0.2, 0.2, 0.2)
    solver: float = 0.4
    random: float = 0.45
    mistake: float = 0.15
    opener_top: int = 50

    def __post_init__(self) -> None:
        if not self.k_weights or any(w < 0 for w in self.k_weights) or sum(self.k_weights) <= 0:
            raise ValueError(f"k_weights must be non-negative with a positive sum, got {list(self.k_weights)}")
        if len(self.k_weights) > 6:
            raise ValueError(f"k_weights allows at most 5 seeded guesses (6 weights), got {len(self.k_weights)}")
        modes = (self.solver, self.random, self.mistake)
        if any(w < 0 for w in modes) or sum(modes) <= 0:
            raise ValueError(f"solver/random/mistake weights must be non-negative with a positive sum, got {modes}")
        if self.opener_top < 1:
            raise ValueError(f"opener_top must be >= 1, got {self.opener_top}")


def history_rng(seed: int, secret: str) -> random.Random:
    """The rng for one game's seeded history: independent of the other games and of their order."""
    return random.Random(f"{seed}:{secret}")


def eval_board(secret: str, seed: int, solver: Solver) -> list[str]:
    """The earlier guesses of a seeded held-out game: the default policy with the game's own rng."""
    return seed_history(secret, history_rng(seed, secret), solver, HistoryPolicy())[0]


def _openers(solver: Solver, top: int) -> list[str]:
    key = ("openers", top)
    cache = solver.__dict__.setdefault("_seeding_cache", {})
    if key not in cache:
        ranked = solver.ranked(np.arange(len(solver.table.answers)), top=top)
        cache[key] = [word for word, _, _ in ranked]
    return cache[key]


def seed_history(secret: str, rng: random.Random, solver: Solver,
                 policy: HistoryPolicy | None = None) -> tuple[list[str], str]:
    """(earlier guesses for `secret`, never the secret itself; the mode that chose them)."""
    policy = policy or HistoryPolicy()
    if secret not in solver.table.answer_index:
        raise ValueError(f"secret {secret!r} is not in the solver's answer list")
    k = rng.choices(range(len(policy.k_weights)), weights=policy.k_weights)[0]
    if k == 0:
        return [], "empty"
    mode = rng.choices(MODES, weights=(policy.solver, policy.random, policy.mistake))[0]
    mistake_at = rng.randrange(k) if mode == "mistake" else -1
    guesses: list[str] = []
    history: list[tuple[str, str]] = []
    for i in range(k):
        cols = solver.candidate_columns(history)
        others = [solver.table.answers[c] for c in cols if solver.table.answers[c] != secret]
        if not others:
            break
        if i == 0:
            guess = rng.choice([w for w in _openers(solver, policy.opener_top) if w != secret])
        elif i == mistake_at:
            guess = rng.choice(solver.table.guesses)
        elif mode == "solver":
            guess = solver.table.guesses[solver.best_guess_row(cols)]
            if guess == secret or guess in guesses:
                guess = rng.choice(others)
        else:
            guess = rng.choice(others)
        if guess == secret or guess in guesses:
            guess = rng.choice([w for w in others if w not in guesses] or others)
        guesses.append(guess)
        history.append((guess, solver.pattern(guess, secret)))
    return guesses, mode
