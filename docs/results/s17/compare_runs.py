"""Side by side, step by step: GRPO runs that drew the same training boards (same config seed). With
`rl.turn_continue: "greedy"` a step's games are the current policy's greedy games on that step's 8 boards,
so the runs' wins on the same boards can be paired. Prints, per block of steps, greedy training wins and
sampled non-word rates of each run, then the paired win counts over all steps both runs reached.

Usage: .venv/bin/python docs/results/s17/compare_runs.py BLOCK LABEL=metrics.jsonl LABEL=metrics.jsonl ...
"""
import json
import sys

from wordle_mlx.plots.stats import mcnemar_exact_p


def steps(path):
    out = {}
    for line in open(path):
        d = json.loads(line)
        if d.get("kind") == "train":          # a resumed run logs the redone steps again: keep the last
            out[d["step"]] = d
    return out


def key(game):
    """A training board: the secret and its seeded guesses (the first `seeded` guesses of the game)."""
    return game["secret"], tuple(game["guesses"][:game.get("seeded", 0)])


block = int(sys.argv[1])
runs = [(arg.split("=", 1)[0], steps(arg.split("=", 1)[1])) for arg in sys.argv[2:]]
common = sorted(set.intersection(*(set(s) for _, s in runs)))
print(f"steps both/all runs reached: {common[0]}-{common[-1]}")
print("| steps | " + " | ".join(f"{name}: greedy wins, sampled non-words" for name, _ in runs) + " |")
for start in range(0, len(common), block):
    part = common[start:start + block]
    cells = []
    for _, s in runs:
        won = sum(g["won"] for k in part for g in s[k]["games"])
        games = sum(len(s[k]["games"]) for k in part)
        rates = [s[k]["invalid_rate"] for k in part if "invalid_rate" in s[k]]     # none for a replay
        inval = f"{100 * sum(rates) / len(rates):.0f}%" if rates else "-"
        cells.append(f"{won}/{games}, {inval}")
    print(f"| {part[0]}-{part[-1]} | " + " | ".join(cells) + " |")
(name_a, a), *rest = runs
for name_b, b in rest:
    only_a = only_b = both = 0
    for k in common:
        ga = {key(g): g["won"] for g in a[k]["games"]}
        for g in b[k]["games"]:
            wa, wb = ga[key(g)], g["won"]
            both += wa and wb
            only_a += wa and not wb
            only_b += wb and not wa
    print(f"{name_a} vs {name_b}: both {both}, only {name_a} {only_a}, only {name_b} {only_b}, "
          f"McNemar exact p {mcnemar_exact_p(only_a, only_b):.3g}")
