"""Run under `mlx.launch` by tests/test_distributed.py: gradients over ranks vs one process on the same data.

`python distributed_check.py OUT_DIR grpo|sft|die`. Every rank builds the tiny model with the same LoRA
weights and the same fixed data, then computes (a) the single-process result on the whole batch
(`World()`, no collectives) and (b) the data-parallel result on its own share with the real group, and
writes `OUT_DIR/<mode>-rank<r>.json` with both gradients' maximum difference. grpo: `policy_update` with
SGD(lr=1) and no clipping, so weights_before - weights_after is the gradient; items are split by group,
as the trainer splits prompts. sft: the trainer's `accumulate_gradients` (all the batches as micro-batches of one
step, divided by every rank's target tokens) on the global batches vs this rank's slices of them (the last batch is short, so one rank gets nothing in it). die: rank 1 exits with code 7
before the first collective; rank 0 must not finish.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from wordle_mlx.llm.model import lora
from wordle_mlx.llm.training.distributed import World, init_world
from wordle_mlx.llm.model.models import load_model

VOCAB = 384


def tiny_policy():
    mx.random.seed(0)
    model, _ = load_model("builtin:tiny-random")
    lora.apply_lora(model, -1, lora.lora_parameters(4, 10.0, 0.0, None))
    for _, m in model.named_modules():
        if hasattr(m, "lora_b"):           # non-zero B, so that lora_a gets a gradient too
            m.lora_b = 0.05 * mx.random.normal(m.lora_b.shape)
    mx.eval(model.parameters())
    return model


def flat(model) -> dict:
    return {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}


def max_diff(a: dict, b: dict) -> tuple[float, float]:
    return (max(float(np.abs(a[k] - b[k]).max()) for k in a), max(float(np.abs(a[k]).max()) for k in a))


def grpo_items():
    from wordle_mlx.llm.play.episode import TokenSequence
    from wordle_mlx.llm.training.rl import ScoredItem

    rng = np.random.default_rng(1)
    items = []
    for group in range(4):
        for _ in range(3):
            n_prompt, n_comp = int(rng.integers(5, 12)), int(rng.integers(3, 9))
            tokens = rng.integers(3, VOCAB, n_prompt + n_comp).tolist()
            seq = TokenSequence(tokens, [0] * n_prompt + [1] * n_comp,
                                [0.0] * n_prompt + (-rng.uniform(4.0, 7.0, n_comp)).tolist())
            items.append(ScoredItem([seq], group, float(rng.normal()), {}))
    return items


def grpo_gradient(items, world) -> tuple[dict, dict]:
    from wordle_mlx.llm.training.rl import LossSettings
    from wordle_mlx.llm.training.rl import UpdateSettings, policy_update

    model = tiny_policy()
    before = flat(model)
    settings = UpdateSettings(LossSettings(beta=0.0, temperature=1.0), max_grad_norm=0.0, max_tokens_per_microbatch=48,
                              max_loss_tokens=12)
    upd = policy_update(model, optim.SGD(learning_rate=1.0), items, settings, world)
    after = flat(model)
    return {k: before[k] - after[k] for k in before}, {"loss": upd.loss, "grad_norm": upd.grad_norm,
                                                       "trained_tokens": upd.trained_tokens,
                                                       "groups": upd.groups, "skipped_groups": upd.skipped_groups}


def check_grpo(world) -> dict:
    items = grpo_items()
    single, s_stats = grpo_gradient(items, World())
    share = [it for it in items if it.group % world.size == world.rank]
    spread, d_stats = grpo_gradient(share, world)
    diff, scale = max_diff(single, spread)
    return {"max_diff": diff, "max_grad": scale, "single": s_stats, "distributed": d_stats, "local_items": len(share)}


def check_sft(world) -> dict:
    from wordle_mlx.llm.training.trainer import Batch, accumulate_gradients
    from wordle_mlx.stages.sft import make_batches, sft_loss

    rng = np.random.default_rng(2)
    seqs = []
    for _ in range(9):                     # batches of 4, 4 and 1 examples
        n_prompt, n_answer = int(rng.integers(4, 10)), int(rng.integers(3, 12))
        seqs.append((rng.integers(3, VOCAB, n_prompt + n_answer).tolist(), n_prompt))
    shape = (4, 8, None)                    # batch size, pad_to, max_seq_length
    out = {}
    for name, w in (("single", World()), ("distributed", world)):
        model = tiny_policy()
        mine = [b for b in make_batches(seqs, *shape, w) if b is not None]
        count, length = w.sum_floats([sum(b.tokens for b in mine), sum(b.length for b in mine)])
        grads, total, _ = accumulate_gradients(model, nn.value_and_grad(model, sft_loss),
                                               Batch([b.loss_args() for b in mine], count), w)
        out[name] = ({k: np.array(v) for k, v in tree_flatten(grads)}, {"loss": total, "count": count,
                                                                         "tokens": length})
    diff, scale = max_diff(out["single"][0], out["distributed"][0])
    return {"max_diff": diff, "max_grad": scale, "single": out["single"][1], "distributed": out["distributed"][1],
            "local_batches": sum(b is not None for b in make_batches(seqs, *shape, world))}


def main() -> None:
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    world = init_world()
    if mode == "die":
        if world.rank == 1:
            sys.stdout.flush()
            os._exit(7)                    # no interpreter teardown: the launcher must see code 7, not a kill
        world.sum_floats([1.0])
        result = {"finished": True}
    else:
        result = check_grpo(world) if mode == "grpo" else check_sft(world)
    result["size"] = world.size
    (out_dir / f"{mode}-rank{world.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
