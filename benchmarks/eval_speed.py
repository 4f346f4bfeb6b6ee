"""Greedy eval in free against grammar decoding: the same games, how much faster.

Plays the shipped adapter greedily on the same first N test words (100 by default) twice in one run, once with
`free` decoding (the model writes its whole reply over the 262k-token vocabulary, mlx-lm's BatchGenerator) and
once with `grammar` decoding (the reply's tags forced, its 5 letters picked over the 26 letter tokens), with the
eval's settings (all games in lockstep, the adapter's prompts). Prints each mode's seconds, wins and replies, how
many of the N game transcripts (every reply's text, in order) are identical, and for each game that differs its
first differing turn with both replies and why they differ; last line `speedup X.XX` (free seconds over grammar).
Usage: python benchmarks/eval_speed.py [--adapter adapters/gemma-3-270m-wordle] [--games 100]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.runtime.blas import reexec_for_linux_cpu  # noqa: E402


def why(free_text: str, grammar_text: str, allowed) -> str:
    """Why a free reply and a grammar reply to the same prompt differ."""
    from wordle_mlx.llm.play.prompts import parse_reply

    parsed = parse_reply(free_text, False, allowed)
    if parsed.error is not None:
        return f"the free reply is not a well-formed letters reply ({parsed.error}); grammar forces the form"
    return ("the free reply is well formed, so at some letter the model's top token over the whole vocabulary "
            "was not its top letter (a token grammar decoding cannot write, such as a capital or a tag)")


def main() -> None:
    reexec_for_linux_cpu()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:gemma-3-270m")
    ap.add_argument("--adapter", default=str(ROOT / "adapters" / "gemma-3-270m-wordle"))
    ap.add_argument("--games", type=int, default=100)
    args = ap.parse_args()

    from wordle_mlx.runtime.blas import describe_blas
    from wordle_mlx.game.splits import split_words
    from wordle_mlx.game.words import guess_list
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.play.rollout import GameSpec, RolloutConfig, play_games

    model, tokenizer = load_model(args.model, adapter_path=args.adapter)
    allowed = frozenset(guess_list())
    words = split_words("test")[:args.games]
    print(f"{args.model} + {Path(args.adapter).name}, greedy, first {len(words)} test words, BLAS: {describe_blas()}")
    runs = {}
    for mode in ("free", "grammar"):
        cfg = RolloutConfig(decode=mode).for_adapter(args.adapter)
        start = time.perf_counter()
        episodes = play_games(model, tokenizer, [GameSpec(w) for w in words], cfg, allowed)
        seconds = time.perf_counter() - start
        runs[mode] = (episodes, seconds)
        turns = sum(len(ep.turns) for ep in episodes)
        print(f"{mode:8s} {seconds:7.1f} s   wins {sum(ep.won for ep in episodes):3d} / {len(words)}   "
              f"{turns} replies   {turns / seconds:.1f} replies/s")
    free, grammar = runs["free"][0], runs["grammar"][0]
    same = 0
    for a, b in zip(free, grammar):
        ta, tb = [t.text for t in a.turns], [t.text for t in b.turns]
        if ta == tb:
            same += 1
            continue
        k = next(i for i, (x, y) in enumerate(zip(ta + [None], tb + [None])) if x != y)
        fa = ta[k] if k < len(ta) else "(game over)"
        fb = tb[k] if k < len(tb) else "(game over)"
        print(f"differs: {a.secret} turn {k + 1}: free {fa!r}, grammar {fb!r}: {why(fa, fb, allowed)}")
    print(f"identical transcripts: {same} / {len(words)}")
    print(f"speedup {runs['free'][1] / runs['grammar'][1]:.2f}")


if __name__ == "__main__":
    main()
