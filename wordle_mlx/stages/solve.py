"""`wordle-mlx solve`: the greedy max-entropy solver, one game or all answers.

`--word W` plays one game and shows its tiles; `--all` plays every answer and reports win rate, mean
guesses, the histogram of guess counts and the seconds taken. The solver is the teacher for the
synthetic data and the baseline in every evaluation.
"""

from __future__ import annotations

import time

import numpy as np

from ..config import StrictModel
from ..errors import UserError
from ..game.feedback import feedback
from ..game.solver import Solver
from ..game.tiles import tiles
from ..game.words import check_word
from ..runtime.progress import console
from .pattern_table import load_table


class SolveConfig(StrictModel):
    word: str | None = None
    all_answers: bool = False
    answers_list: str = "answers"
    allowed_list: str = "allowed"
    json_output: bool = False


def summarise(games: dict[str, list[str]], seconds: float) -> dict:
    """Win rate, mean guesses and histogram for {secret: guesses}."""
    lengths = [len(g) for g in games.values()]
    wins = [g[-1] == s for s, g in games.items()]
    hist = {str(k): int(np.sum([n == k and w for n, w in zip(lengths, wins)])) for k in range(1, 7)}
    hist["lost"] = int(len(wins) - sum(wins))
    won_lengths = [n for n, w in zip(lengths, wins) if w]
    return {
        "games": len(games),
        "wins": int(sum(wins)),
        "win_rate": float(np.mean(wins)) if wins else 0.0,
        "mean_guesses": float(np.mean(won_lengths)) if won_lengths else None,
        "histogram": hist,
        "seconds": round(seconds, 3),
    }


def run(cfg: SolveConfig) -> dict:
    if not cfg.all_answers and cfg.word is None:
        raise UserError("solve: give --word WORD or --all")
    table = load_table(cfg.answers_list, cfg.allowed_list, show_progress=not cfg.json_output)
    solver = Solver(table)
    if cfg.word is not None:
        word = cfg.word.strip().lower()
        problem = check_word(word)
        if problem:
            raise UserError(f"--word: {problem}")
        if word not in table.answer_index:
            raise UserError(f"--word: {word!r} is not in the answer list ({cfg.answers_list})")
        guesses = solver.play(word)
        if not cfg.json_output:
            for i, g in enumerate(guesses, start=1):
                console.print(f"{i}. {tiles(g, feedback(g, word))}")
        return {"secret": word, "guesses": guesses, "won": guesses[-1] == word}
    start = time.perf_counter()
    games = {secret: solver.play(secret) for secret in table.answers}
    result = summarise(games, time.perf_counter() - start)
    if not cfg.json_output:
        console.print(f"games {result['games']}  wins {result['wins']} ({100 * result['win_rate']:.2f}%)  "
                      f"mean guesses {result['mean_guesses']:.4f}  in {result['seconds']:.1f} s")
        console.print("histogram: " + "  ".join(f"{k}:{v}" for k, v in result["histogram"].items()))
    return result
