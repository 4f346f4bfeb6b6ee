#!/usr/bin/env python3
"""Hold some train secrets out of SFT data, and write GRPO prompts over exactly those secrets.

The held-out set is the first N words of the train split (so `wordle-mlx eval --split train --games N` plays
exactly them). From an SFT data folder it drops every example whose secret is held out and every example whose
label (the guess in the reply) is a held-out word, so the SFT model is never taught to spell them; then it
writes `rl_train.jsonl` prompt records `{"secret", "history", "mode"}` for the held-out secrets only (histories
drawn like GRPO's own generator, `seeding.seed_history`), for a GRPO config with `prompts.source: "file"`.
This asks whether reward on words SFT never labelled teaches what labels did not (session 39, docs/RESULTS.md).

    python scripts/heldout_secrets.py --data data/choice2-cover5c4 --out data/choice2-cover5c4-ho200 \
        --count 200 --prompts-per-secret 2 --k-weights 0.7 0.1 0.1 0.1 --seed 0
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wordle_mlx.fileio import write_text_atomic  # noqa: E402
from wordle_mlx.game.seeding import HistoryPolicy, seed_history  # noqa: E402
from wordle_mlx.game.solver import Solver  # noqa: E402
from wordle_mlx.game.splits import split_words  # noqa: E402
from wordle_mlx.llm.prompts import parse_reply  # noqa: E402
from wordle_mlx.stages.entropy import load_table  # noqa: E402


def reply_word(record: dict) -> str:
    """The guess an SFT example teaches: the word (or letters) inside <guess>…</guess> of its last message."""
    text = record["messages"][-1]["content"]
    guess = parse_reply(text, require_think=False).guess
    if guess is None:
        raise ValueError(f"no <guess> in reply {text!r}")
    return guess


def filter_split(src: Path, dst: Path, held: set[str]) -> dict:
    kept, by_secret, by_label = [], 0, 0
    for line in src.read_text().splitlines():     # raw lines, so kept examples stay byte for byte
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("meta", {}).get("secret") in held:
            by_secret += 1
        elif reply_word(rec) in held:
            by_label += 1
        else:
            kept.append(line)
    write_text_atomic(dst, "".join(x + "\n" for x in kept))
    return {"kept": len(kept), "dropped_secret": by_secret, "dropped_label": by_label}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="SFT data folder with train.jsonl / valid.jsonl")
    ap.add_argument("--out", type=Path, required=True, help="new data folder (also gets rl_train.jsonl)")
    ap.add_argument("--count", type=int, default=200, help="hold out the first N train-split words")
    ap.add_argument("--prompts-per-secret", type=int, default=2)
    ap.add_argument("--k-weights", type=float, nargs="+", default=[0.7, 0.1, 0.1, 0.1])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for name in ("train.jsonl", "valid.jsonl"):
        if not (args.data / name).is_file():
            print(f"error: {args.data / name}: no such file", file=sys.stderr)
            return 2
    train = split_words("train")
    if not 0 < args.count <= len(train):
        print(f"error: --count must be 1-{len(train)}, got {args.count}", file=sys.stderr)
        return 2
    held = train[:args.count]
    args.out.mkdir(parents=True, exist_ok=True)
    stats = {name: filter_split(args.data / name, args.out / name, set(held)) for name in ("train.jsonl", "valid.jsonl")}

    rng = random.Random(args.seed)
    solver = Solver(load_table(show_progress=False))
    policy = HistoryPolicy(tuple(args.k_weights))
    records = []
    for _ in range(args.prompts_per_secret):
        order = list(held)
        rng.shuffle(order)
        for secret in order:
            history, mode = seed_history(secret, rng, solver, policy)
            records.append({"secret": secret, "history": history, "mode": mode})
    write_text_atomic(args.out / "rl_train.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    if (args.data / "stats.json").is_file():   # the prompt the data was made with, which SFT saves with the adapter
        source_stats = json.loads((args.data / "stats.json").read_text())
        source_stats["heldout_note"] = f"copied from {args.data}; this folder's counts are in heldout.json"
        write_text_atomic(args.out / "stats.json", json.dumps(source_stats, indent=1) + "\n")
    stats.update({"source": str(args.data), "held_out": held, "rl_prompts": len(records),
                  "k_weights": args.k_weights, "seed": args.seed})
    write_text_atomic(args.out / "heldout.json", json.dumps(stats, indent=1) + "\n")
    print(json.dumps({k: v for k, v in stats.items() if k != "held_out"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
