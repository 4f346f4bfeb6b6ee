"""Memory soak: N GRPO steps on the tiny model, watching resident memory for leaks.

Each step is a real one (a GRPO rollout of B games with the tiny random Gemma 3, G replies sampled to each
board plus the greedy one the game goes on with, rewards, and a policy update of its LoRA weights). Rewards are nudged apart by a tiny amount per sample so that
every step really runs the backward pass and the optimizer (a random model's games all score alike).
Before each reading the MLX buffer cache is cleared (freed buffers MLX keeps for reuse are not a leak,
and they make RSS swing by tens of MB from step to step; so is freed malloc memory, with glibc's
malloc_trim); the cache size is printed alongside.
Prints RSS (VmRSS from /proc/self/status, else ru_maxrss) every 10 steps and after step 5; the last
line is `growth X.X%`: RSS after the last step against RSS after step 5 (must stay within 10%).
Usage: python benchmarks/memory_soak.py [--steps 30] [--batch 2] [--generations 4]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wordle_mlx.runtime.blas import reexec_for_linux_cpu  # noqa: E402


def rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    scale = 1024 * 1024 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def release_free_heap() -> None:
    """Hand freed malloc arenas back to the OS (glibc), so RSS shows memory still in use."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def main() -> int:
    reexec_for_linux_cpu()
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=2, help="B: prompts per step")
    parser.add_argument("--generations", type=int, default=4, help="G: replies sampled to each board")
    parser.add_argument("--max-tokens", type=int, default=12)
    args = parser.parse_args()

    import mlx.core as mx
    import mlx.optimizers as optim

    from wordle_mlx.game.rewards import RewardWeights, Rewards
    from wordle_mlx.game.seeding import seed_history
    from wordle_mlx.game.solver import Solver
    from wordle_mlx.game.splits import split_words
    from wordle_mlx.game.words import answers, guess_list
    from wordle_mlx.llm.play.generation import BatchedGenerator
    from wordle_mlx.llm.training.rl import LossSettings
    from wordle_mlx.llm.training.rl import Player, UpdateSettings, policy_update, rollout
    from wordle_mlx.llm.model.lora import apply_lora, lora_parameters
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.play.prompts import PromptConfig
    from wordle_mlx.llm.play.rollout import GameSpec, RolloutConfig
    from wordle_mlx.stages.pattern_table import load_table

    mx.random.seed(0)
    model, tok = load_model("builtin:tiny-random")
    apply_lora(model, -1, lora_parameters(4, 10.0, 0.0, None))
    optimizer = optim.AdamW(learning_rate=1e-3)
    solver, train, allowed = Solver(load_table(show_progress=False)), split_words("train"), frozenset(guess_list())
    rewards = Rewards(RewardWeights(early=1.2), answers())
    rcfg = RolloutConfig(decode="free", temperature=1.0, max_tokens_per_turn=args.max_tokens, max_invalid_replies=2,
                         prompt=PromptConfig(require_think=False))
    settings = UpdateSettings(LossSettings(temperature=1.0))
    generate = BatchedGenerator(model, tok)
    rng = random.Random(0)
    first = None
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        mx.random.seed(step)
        specs = []
        for _ in range(args.batch):
            secret = train[rng.randrange(len(train))]
            specs.append(GameSpec(secret, seed_history(secret, rng, solver)[0]))
        out = rollout(Player(model, tok, generate), specs, rcfg, allowed, rewards, args.generations)
        for i, item in enumerate(out.items):
            item.reward += 1e-3 * i
        upd = policy_update(model, optimizer, out.items, settings)
        if not upd.applied:
            raise SystemExit(f"step {step}: the update did not run")
        cached = mx.get_cache_memory()
        gc.collect()
        mx.clear_cache()         # MLX's free-buffer cache is reusable memory, not a leak: measure without it
        release_free_heap()
        rss = rss_mb()
        if step == 5:
            first = rss
        if step == 5 or step % 10 == 0 or step == args.steps:
            print(f"step {step:4d}  rss {rss:8.1f} MB  mlx active {mx.get_active_memory() / 1e6:7.1f} MB  "
                  f"mlx cache before clearing {cached / 1e6:7.1f} MB  "
                  f"{time.perf_counter() - start:6.1f} s", flush=True)
    base = first if first is not None else rss
    print(f"growth {100 * (rss - base) / base:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
