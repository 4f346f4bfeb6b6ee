#!/usr/bin/env python3
"""Greedy wins on held-out words, split by when a GRPO run rewarded them: paired against a start eval.

The GRPO prompt file (`scripts/heldout_secrets.py`'s `rl_train.jsonl`) is read in order, B records a step, so
its lines 1-64 are steps 1-8 at B = 8, and so on. For two evals on the same words (`wordle-mlx eval --split
train`), this prints, for each block of `--block` prompt lines and for the words in no block, the wins of each
eval and the games only one of them won, with the exact McNemar p-value (session 39, docs/RESULTS.md).

    python scripts/heldout_wins.py docs/results/s39/eval_sftho_train200_greedy.json \
        docs/results/s39/eval_grpo_ho200_step16_train200_greedy.json \
        --prompts data/choice2-cover5c4-ho200/rl_train.jsonl --block 64 --blocks 2
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wordle_mlx.plots.stats import mcnemar_exact_p, paired_counts  # noqa: E402


def outcomes(path: Path) -> dict[str, bool]:
    records = json.loads(path.read_text()).get("game_records")
    if not isinstance(records, list) or not records:
        raise SystemExit(f"error: {path}: no game_records (an eval JSON from `wordle-mlx eval` has them)")
    return {r["secret"]: bool(r["won"]) for r in records}


def rows(start: dict[str, bool], after: dict[str, bool], groups: list[tuple[str, list[str]]]) -> list[dict]:
    out = []
    for name, words in groups:
        pair = paired_counts(words, [start[w] for w in words], words, [after[w] for w in words])
        out.append({"words": name, "games": len(words), "start": pair["both"] + pair["only_a"],
                    "after": pair["both"] + pair["only_b"], "gained": pair["only_b"], "lost": pair["only_a"],
                    "p": mcnemar_exact_p(pair["only_b"], pair["only_a"])})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("start", type=Path, help="eval JSON of the starting player")
    ap.add_argument("after", type=Path, help="eval JSON of the trained player, on the same words")
    ap.add_argument("--prompts", type=Path, required=True, help="the GRPO run's prompt file, read in order")
    ap.add_argument("--block", type=int, default=64, help="prompt lines per block (steps x batch_prompts)")
    ap.add_argument("--blocks", type=int, default=1)
    args = ap.parse_args()
    start, after = outcomes(args.start), outcomes(args.after)
    if set(start) != set(after):
        raise SystemExit(f"error: {args.start} and {args.after} played different words")
    secrets = [json.loads(line)["secret"] for line in args.prompts.read_text().splitlines() if line.strip()]
    groups, seen = [], set()
    for k in range(args.blocks):
        block = [w for w in dict.fromkeys(secrets[k * args.block:(k + 1) * args.block]) if w in start and w not in seen]
        seen.update(block)
        groups.append((f"prompt lines {k * args.block + 1}-{(k + 1) * args.block}", block))
    groups.append(("in no block", [w for w in start if w not in seen]))
    groups.append(("all", list(start)))
    print("| words | games | start | after | gained | lost | p |\n|---|---:|---:|---:|---:|---:|---:|")
    for r in rows(start, after, groups):
        print(f"| {r['words']} | {r['games']} | {r['start']} | {r['after']} | {r['gained']} | {r['lost']} | {r['p']:.3g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
