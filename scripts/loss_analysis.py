"""Where held-out games are lost: how many answers still fit when a game ends without a win, and whether the
secret was ever an SFT label.

For each `wordle-mlx eval` JSON it replays every lost game's valid guesses against its secret and counts the
answers that still fit the clues (the secret included) when the game ended, split by how it ended: six valid
guesses, or fewer (the third invalid reply of a turn ends the game). With `--sft-data FOLDER`, it also splits
the games by whether the secret is the target of any record in FOLDER/train.jsonl (a word the model was taught
to say somewhere, never as that board's secret when it is a test word) and gives each part's win rate. The
answer list is read here, after the games, to explain them; the eval itself never reads it.

    python3 scripts/loss_analysis.py docs/results/s31/eval_sft_last6_step240_greedy.json --sft-data data/choice-s24
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wordle_mlx.game.feedback import feedback  # noqa: E402
from wordle_mlx.game.words import answers  # noqa: E402

BUCKETS = ("1", "2-3", "4-10", ">10")


def bucket(n: int) -> str:
    return "1" if n == 1 else "2-3" if n <= 3 else "4-10" if n <= 10 else ">10"


def analyse(records: list[dict], labels: set[str] | None = None, words=None) -> dict:
    """Counts of lost games by (ending, answers still fitting) and, with `labels`, wins by label status."""
    words = words or answers()
    losses = {"six_guesses": Counter(), "invalid_replies": Counter()}
    for game in records:
        if game["won"]:
            continue
        fits = [w for w in words if all(feedback(g, w) == feedback(g, game["secret"]) for g in game["guesses"])]
        if game["secret"] not in fits:
            raise ValueError(f"game of {game['secret']!r}: the secret does not fit its own clues")
        ending = "six_guesses" if len(game["guesses"]) >= 6 else "invalid_replies"
        losses[ending][bucket(len(fits))] += 1
    out = {"games": len(records), "wins": sum(g["won"] for g in records),
           "losses": {k: {b: v.get(b, 0) for b in BUCKETS} for k, v in losses.items()}}
    if labels is not None:
        for part, keep in (("secret_was_a_label", True), ("secret_never_a_label", False)):
            games = [g for g in records if (g["secret"] in labels) == keep]
            out[part] = {"games": len(games), "wins": sum(g["won"] for g in games)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("evals", nargs="+", type=Path, help="wordle-mlx eval JSON files (with game_records)")
    ap.add_argument("--sft-data", type=Path, help="SFT data folder whose train.jsonl targets count as labels")
    args = ap.parse_args()
    labels = None
    if args.sft_data is not None:
        path = args.sft_data / "train.jsonl"
        if not path.is_file():
            sys.exit(f"loss_analysis: {path}: file not found")
        labels = {json.loads(line)["meta"]["target"] for line in path.read_text().splitlines() if line.strip()}
    for path in args.evals:
        try:
            records = json.loads(path.read_text())["game_records"]
        except (OSError, ValueError, KeyError) as exc:
            sys.exit(f"loss_analysis: {path}: not an eval JSON with game_records ({exc!r})")
        result = analyse(records, labels)
        print(f"{path}: {result['wins']} / {result['games']} won")
        for ending, counts in result["losses"].items():
            print(f"  lost, {ending.replace('_', ' ')}: " + ", ".join(f"{counts[b]} with {b} fitting" for b in BUCKETS))
        for part in ("secret_was_a_label", "secret_never_a_label"):
            if part in result:
                p = result[part]
                print(f"  {part.replace('_', ' ')} in {args.sft_data}: {p['wins']} / {p['games']} won")


if __name__ == "__main__":
    main()
