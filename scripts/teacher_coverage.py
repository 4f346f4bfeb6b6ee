"""How much of the teacher's play on the test words an SFT data set shows: a ceiling for pure imitation.

A greedy player that copied the teacher exactly would play the teacher's game on every test word. This
script follows that game for each test secret (the data config's teacher: the best-splitting candidate)
and asks whether every board on it (the earlier guesses with their feedback) occurs as an example in the
given SFT data, i.e. was reached by some training secret. Only the secrets whose whole game is covered
can be won by imitation alone; the others need a board the model never saw.

    python3 scripts/teacher_coverage.py data/sft data/sft-focus
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wordle_mlx.game.feedback import feedback  # noqa: E402
from wordle_mlx.game.solver import Solver  # noqa: E402
from wordle_mlx.game.splits import split_answers  # noqa: E402
from wordle_mlx.game.state import MAX_GUESSES  # noqa: E402
from wordle_mlx.stages.data import teacher_guess  # noqa: E402
from wordle_mlx.stages.entropy import load_table  # noqa: E402


def teacher_game(solver: Solver, secret: str, threshold: int) -> list[tuple[tuple, str]]:
    """The teacher's game from the empty board: (board, guess) per turn, board = ((guess, pattern), ...)."""
    history: list[tuple[str, str]] = []
    turns = []
    while len(history) < MAX_GUESSES:
        guess = teacher_guess(solver, solver.candidate_columns(history), threshold)
        turns.append((tuple(history), guess))
        history.append((guess, feedback(guess, secret)))
        if guess == secret:
            break
    return turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dirs", nargs="+", type=Path, help="SFT data folders (train.jsonl, stats.json)")
    ap.add_argument("--candidate-threshold", type=int, default=100000, help="the data config's teacher setting")
    args = ap.parse_args()
    solver = Solver(load_table(show_progress=False))
    boards = set()
    for folder in args.data_dirs:
        path = folder / "train.jsonl"
        if not path.is_file():
            sys.exit(f"error: {path}: missing (run `wordle-mlx data --config ...` first)")
        for line in path.read_text().splitlines():
            meta = json.loads(line)["meta"]
            if "retry_error" not in meta:
                boards.add((tuple((g, feedback(g, meta["secret"])) for g in meta["history"]), meta["target"]))
    covered, first_gap = 0, Counter()
    test = split_answers(solver.table.answers)["test"]
    for secret in test:
        turns = teacher_game(solver, secret, args.candidate_threshold)
        gaps = [i + 1 for i, turn in enumerate(turns) if turn not in boards]
        covered += not gaps
        first_gap[gaps[0] if gaps else 0] += 1
    print(f"test secrets whose whole teacher game is on training boards: {covered} / {len(test)} "
          f"({100 * covered / len(test):.1f}%)")
    print("first turn not in the data (0 = none): " + ", ".join(f"{k}: {v}" for k, v in sorted(first_gap.items())))


if __name__ == "__main__":
    main()
