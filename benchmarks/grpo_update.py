"""GRPO update: replies to one prompt packed with the prompt run once, against plain packing.

Builds the items of one GRPO step on the real 270M (B prompts, each a compact Wordle board rendered
by the chat template, and G sampled replies of the letters format each, with rewards spread so that no
group is skipped), then times `policy_update` with `share_prompts` on and off from the same starting
weights (SGD, so the weights after the two updates can be compared), alternating the two. Prints the
padded tokens each packing runs through the model (shared: the micro-batches' start the prompts share, once each,
their prompts' rests and the replies), seconds per update, the largest weight difference
after the update, and last `speedup X.XX` (plain over shared).
Usage: python benchmarks/grpo_update.py [--model builtin:gemma-3-270m] [--prompts 4] [--generations 8] [--repeats 2]
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


def main() -> None:
    reexec_for_linux_cpu()
    import mlx.core as mx
    import mlx.optimizers as optim
    import numpy as np
    from mlx.utils import tree_flatten, tree_unflatten

    from wordle_mlx.game.feedback import feedback
    from wordle_mlx.llm.model import lora
    from wordle_mlx.llm.play.episode import TokenSequence
    from wordle_mlx.llm.training.rl import LossSettings
    from wordle_mlx.llm.training.packing import micro_batches, split_batch
    from wordle_mlx.llm.training.rl import ScoredItem, UpdateSettings, policy_update
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.play.prompts import PromptConfig, build_messages, format_reply

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin:gemma-3-270m")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    model, tok = load_model(args.model)
    mx.random.seed(0)
    lora.apply_lora(model, -1, lora.lora_parameters(16, 20.0, 0.0, None))
    cfg = PromptConfig(style="compact", guess_format="letters", require_think=False)
    rng = np.random.default_rng(0)
    words = ["raise", "clout", "denim", "pygmy", "fetch", "grave", "salon", "truth", "abhor", "milky"]
    items = []
    for b in range(args.prompts):
        secret = words[b % len(words)]
        board = [(g, feedback(g, secret)) for g in words[len(words) - 1 - b:][:2] if g != secret]
        prompt = tok.apply_chat_template(build_messages(cfg, board), add_generation_prompt=True)
        for g in range(args.generations):
            reply = tok.encode(format_reply(None, words[int(rng.integers(len(words)))], guess_format="letters"),
                               add_special_tokens=False) + [tok.get_vocab()["<end_of_turn>"]]
            seq = TokenSequence(list(prompt) + reply, [0] * len(prompt) + [1] * len(reply),
                                [0.0] * len(prompt) + [-1.0] * len(reply))
            items.append(ScoredItem([seq], b, float(g), {}))
    seqs = [it.sequences[0] for it in items]
    shared_tokens = 0
    for idx, pack in micro_batches(seqs, True, 2048, 256):     # the update's own micro-batches and packing
        b = pack([seqs[i] for i in idx], [0.0] * len(idx), [np.zeros(sum(seqs[i].mask)) for i in idx])
        start = 0 if b.prefix_start is None else len(b.prefix_start)
        shared_tokens += start + (0 if b.prefix is None else b.prefix.size) + b.inputs.size
    plain_tokens = sum(len(idx) * (max(len(seqs[i].tokens) for i in idx) - 1) for idx in split_batch(seqs, 2048, 256))
    start = list(tree_flatten(model.trainable_parameters()))
    times = {"plain": [], "shared": []}
    after = {}
    for _ in range(args.repeats):
        for name, share in (("plain", False), ("shared", True)):
            model.update(tree_unflatten([(k, mx.array(v)) for k, v in start]))
            settings = UpdateSettings(LossSettings(), share_prompts=share)
            t0 = time.perf_counter()
            policy_update(model, optim.SGD(learning_rate=1e-3), items, settings)
            times[name].append(time.perf_counter() - t0)
            after[name] = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    diff = max(float(np.abs(after["plain"][k] - after["shared"][k]).max()) for k in after["plain"])
    plain_s, shared_s = statistics.median(times["plain"]), statistics.median(times["shared"])
    print(f"{args.prompts} prompts x {args.generations} replies: tokens through the model plain {plain_tokens}, "
          f"shared {shared_tokens}")
    print(f"update seconds: plain {plain_s:.2f}, shared {shared_s:.2f}; max weight difference after the update {diff:.2e}")
    print(f"speedup {plain_s / shared_s:.2f}")


if __name__ == "__main__":
    main()
