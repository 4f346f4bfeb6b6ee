"""Rollout throughput: the batched engine vs one `mlx_lm` generate call per game turn.

Plays the same games two ways on the same model: (a) `rollout.play_games`, all games' turns batched;
(b) the seed project's loop, one `mlx_lm.stream_generate` call per game turn (stopping at `</guess>` or an
end token, so it does no extra work), on exactly the prompts the engine saw. Both sides use the first
`--games` test words, an empty board, temperature 0 and `--max-tokens` per reply, and are capped at
`--turns` turns per game so the run stays short. Reports completion ("game") tokens per second for each
and their ratio; the last line is `speedup X.XX`.
Usage: .venv/bin/python benchmarks/rollout_throughput.py [--model builtin:gemma-3-270m] [--games 8] [--turns 2]
(8 games by default keep the sequential side under about ten minutes on a loaded 2-core CPU; --games 16 batches
more rows, which favours the engine)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wordle_mlx.runtime.blas import reexec_for_linux_cpu  # noqa: E402


def sequential(model, tokenizer, prompts: list[list[int]], max_tokens: int) -> int:
    """One generate call per prompt, as the seed project did; returns completion tokens generated."""
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    from wordle_mlx.llm.play.tokens import end_token_ids

    ends, sampler, total = end_token_ids(tokenizer), make_sampler(0.0), 0
    for prompt in prompts:
        text = ""
        for response in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens, sampler=sampler):
            total += 1
            text += response.text
            if response.token in ends or "</guess>" in text.lower():
                break
    return total


def main() -> None:
    reexec_for_linux_cpu()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:gemma-3-270m")
    parser.add_argument("--games", type=int, default=8)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--no-prefix-reuse", action="store_true")
    args = parser.parse_args()

    from wordle_mlx.game.splits import split_words
    from wordle_mlx.game.words import guess_list
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.play.rollout import GameSpec, RolloutConfig, play_games

    model, tokenizer = load_model(args.model)
    cfg = RolloutConfig(decode="free", temperature=0.0, max_tokens_per_turn=args.max_tokens, max_turns=args.turns,
                        reuse_prefix=not args.no_prefix_reuse)
    games = [GameSpec(w) for w in split_words("test")[: args.games]]
    allowed = frozenset(guess_list())
    play_games(model, tokenizer, games[:2], cfg.model_copy(update={"max_turns": 1, "max_tokens_per_turn": 4}),
               allowed)   # warm-up

    start = time.perf_counter()
    episodes = play_games(model, tokenizer, games, cfg, allowed)
    engine_s = time.perf_counter() - start
    engine_tokens = sum(ep.completion_tokens for ep in episodes)
    prompts = [t.prompt_tokens for ep in episodes for t in ep.turns]

    start = time.perf_counter()
    seq_tokens = sequential(model, tokenizer, prompts, args.max_tokens)
    seq_s = time.perf_counter() - start

    engine_tps, seq_tps = engine_tokens / engine_s, seq_tokens / seq_s
    print(f"model {args.model}: {len(games)} games, {len(prompts)} game turns (<= {args.turns} per game), "
          f"max {args.max_tokens} tokens per reply, temperature 0, prefix reuse {cfg.reuse_prefix}")
    print(f"engine:     {engine_tokens} tokens in {engine_s:.1f} s = {engine_tps:.1f} game-tokens/s")
    print(f"sequential: {seq_tokens} tokens in {seq_s:.1f} s = {seq_tps:.1f} game-tokens/s")
    print(f"speedup {engine_tps / seq_tps:.2f}")


if __name__ == "__main__":
    main()
