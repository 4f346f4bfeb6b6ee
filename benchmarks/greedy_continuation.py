"""GRPO rollouts with the greedy reply in the sampling batch, or in a second generate call.

Each turn of a GRPO rollout samples G replies per board and also decodes the policy's greedy reply, which the
game goes on with (and which joins its group). Before, that was a second generation call, which prefilled
every board's prompt again and decoded B greedy rows at a small batch size. Now
(`rollout.sample_replies_and_greedy`) the greedy reply is one more row of the sampling batch: it shares
its prompt's prefill with the G samples. This script runs `rl.rollout` (llm/training/rl.py) both ways, on the
same boards and seeds, alternated, and prints the median seconds, the prompt tokens prefilled and the
ratio. The two-call path is the same code called through a backend that is not a `BatchedGenerator` (the
path scripted backends take); it needs temperature 1, where the greedy reply's log-probs are the same either way.
Last line: `speedup X.XX` (two calls over one batch, median seconds per rollout).
Usage: python benchmarks/greedy_continuation.py [--boards 8] [--generations 8] [--repeats 2]
       [--adapter adapters/gemma-3-270m-wordle] [--model builtin:gemma-3-270m]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.runtime.blas import reexec_for_linux_cpu  # noqa: E402


class TwoCalls:
    """The same MLX backend behind a plain callable: `sample_replies_and_greedy` then makes two calls."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, prompts, cfg):
        return self.inner(prompts, cfg)


def main() -> None:
    reexec_for_linux_cpu()
    import mlx.core as mx

    from wordle_mlx.game.rewards import Rewards, RewardWeights
    from wordle_mlx.game.splits import split_words
    from wordle_mlx.game.words import answers, guess_list
    from wordle_mlx.llm.play.generation import BatchedGenerator
    from wordle_mlx.llm.training.rl import Player, rollout
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.play.prompts import PromptConfig, choose_prompt
    from wordle_mlx.llm.play.rollout import GameSpec, RolloutConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="builtin:gemma-3-270m")
    ap.add_argument("--adapter", default=str(ROOT / "adapters" / "gemma-3-270m-wordle"))
    ap.add_argument("--boards", type=int, default=8)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    model, tokenizer = load_model(args.model, args.adapter or None)
    prompt = choose_prompt(PromptConfig(), False, args.adapter or None)
    cfg = RolloutConfig(decode="free", temperature=1.0, max_tokens_per_turn=args.max_tokens, completion_batch_size=64,
                        prompt=prompt)
    boards = [GameSpec(w) for w in split_words("train")[:args.boards]]
    allowed = frozenset(guess_list())
    rewards = Rewards(RewardWeights(), answers())
    times = {"two calls": [], "one batch": []}
    prefilled = {"two calls": 0, "one batch": 0}
    replies = {"two calls": 0, "one batch": 0}
    for r in range(args.repeats):
        for name in times:
            backend = BatchedGenerator(model, tokenizer)
            generate = TwoCalls(backend) if name == "two calls" else backend
            mx.random.seed(r)
            t0 = time.perf_counter()
            out = rollout(Player(model, tokenizer, generate), boards, cfg, allowed, rewards, args.generations)
            times[name].append(time.perf_counter() - t0)
            prefilled[name] += backend.prefilled_tokens
            replies[name] += len(out.replies)
            print(f"repeat {r + 1} {name}: {times[name][-1]:.1f} s, {backend.prefilled_tokens} prompt tokens "
                  f"prefilled, {len(out.replies)} sampled replies, {len(out.episodes)} games", flush=True)
    for name in times:
        print(f"{name}: median {statistics.median(times[name]):.1f} s per rollout, "
              f"{prefilled[name] / args.repeats:.0f} prompt tokens prefilled, "
              f"{replies[name] / args.repeats:.0f} sampled replies per rollout")
    print(f"speedup {statistics.median(times['two calls']) / statistics.median(times['one batch']):.2f}")


if __name__ == "__main__":
    main()
