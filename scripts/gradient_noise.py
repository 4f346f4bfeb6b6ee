"""How much of a GRPO step's gradient is signal, next to an SFT step's: per-unit gradients and the noise scale.

GRPO on this CPU moved greedy play by no more than the noise in 10-12 steps at lr 1e-5 to 3e-5, and
made sampled training play worse at lr 5e-5 (docs/RESULTS.md, session 11). This script measures why. It
takes a GRPO config, plays one turn-mode rollout of `--boards` boards with the config's policy (G replies
per board and turn), and computes the LoRA gradient of every live group alone (zero-variance groups have
no gradient): the group's clipped-ratio loss with token-mean weights, as `grpo_step.policy_update` would.
With `--sft-data` it does the same for single SFT examples (the token-mean cross-entropy of one example).
From K per-unit gradients g_i it prints the unbiased estimates of the mean's squared norm |mu|^2 =
(|sum g|^2 - sum |g|^2) / (K (K - 1)) (with its standard error) and of the noise tr(Sigma) =
(sum |g|^2 - |sum g|^2 / K) / (K - 1), and their ratio B_noise = tr(Sigma) / |mu|^2: the number of units a step must average before its gradient
holds as much signal as noise (the "simple noise scale" of McCandlish et al., 2018, "An Empirical Model of
Large-Batch Training"). Adam normalises each step to about the learning rate, so a step of far fewer units
than B_noise moves the weights mostly at random. The same groups are also measured with a denser credit
(`letter_credit`): a reply that is not a word is blamed only from its first letter that no allowed word
continues, instead of on every token.

    python3 scripts/gradient_noise.py --config docs/results/s11/ablation_grpo_sharpen_config.json --boards 24 \
        --sft-data data/choice --sft-examples 48
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def flat(grads) -> np.ndarray:
    from mlx.utils import tree_flatten

    return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for _, v in tree_flatten(grads)])


def noise_scale(vectors: list[np.ndarray]) -> dict:
    """|mu|^2, tr(Sigma) and B_noise from per-unit gradient vectors (see the module docstring)."""
    k = len(vectors)
    if k < 2:
        raise SystemExit(f"need at least 2 per-unit gradients, got {k}")
    total = np.sum(vectors, axis=0)
    sq = float(sum(v @ v for v in vectors))
    mu2 = (float(total @ total) - sq) / (k * (k - 1))
    trace = (sq - float(total @ total) / k) / (k - 1)
    # |mu|^2 is the mean of h_i = g_i . (sum of the others) / (K - 1); a U-statistic's standard error is
    # about 2 std(h) / sqrt(K)
    h = np.array([float(v @ (total - v)) / (k - 1) for v in vectors])
    se = float(2 * h.std(ddof=1) / np.sqrt(k))
    return {"units": k, "mean_sq_norm": mu2, "mean_sq_norm_se": se, "noise_trace": trace,
            "noise_scale": trace / mu2 if mu2 > 0 else None,
            # a one-sided 95% bound: |mu|^2 < mu2 + 1.645 se, so B_noise > trace / that
            "noise_scale_lower_bound": trace / (mu2 + 1.645 * se) if mu2 + 1.645 * se > 0 else None,
            "mean_unit_norm": float(np.mean([np.sqrt(v @ v) for v in vectors]))}


def grpo_units(cfg, boards: int, seed: int):
    import mlx.core as mx
    import mlx.nn as nn

    from wordle_mlx.game.rewards import Rewards
    from wordle_mlx.game.solver import Solver
    from wordle_mlx.game.words import answers, guess_list
    from wordle_mlx.llm import grpo_step
    from wordle_mlx.llm.advantages import group_advantages
    from wordle_mlx.llm.grpo_loss import LossSettings, averaging_weights, batch_arrays, grpo_loss, pack_shared_batch
    from wordle_mlx.stages.entropy import load_table
    from wordle_mlx.stages.grpo import PromptSource, load_policy, rollout_config

    rl = cfg.rl
    allowed = frozenset(guess_list())
    mx.random.seed(seed)
    model, tokenizer, _ = load_policy(cfg)
    specs = PromptSource(cfg, Solver(load_table(show_progress=False)), allowed, seed).draw(boards)
    t0 = time.perf_counter()
    out = grpo_step.rollout_turn_mode(grpo_step.Player(model, tokenizer), specs, rollout_config(cfg, rl.temperature, seed),
                                      allowed, Rewards(cfg.reward, answers()),
                                      grpo_step.GroupSettings(rl.num_generations))
    items = out.items
    adv, skipped = group_advantages([it.reward for it in items], [it.group for it in items],
                                    scale=cfg.grpo.advantage == "normalized")
    settings = LossSettings(cfg.grpo.epsilon, cfg.grpo.epsilon_high, 0.0, rl.temperature)
    value_and_grad = nn.value_and_grad(model, lambda arrays: grpo_loss(model, arrays, settings)[0])
    prefixes = {w[:j] for w in allowed for j in range(1, 6)}
    model.train()
    vectors = {"sequence": [], "letters": []}
    for g in sorted({it.group for it in items}):
        idx = [i for i, it in enumerate(items) if it.group == g]
        if not np.any(adv[idx]):
            continue
        seqs = [items[i].sequences[0] for i in idx]
        weights = averaging_weights([sum(q.mask) for q in seqs], "token")   # the group's token mean
        batch = pack_shared_batch(seqs, [float(adv[i]) for i in idx], weights)
        for credit in vectors:
            if credit == "letters":
                batch.advantages = letter_credit(batch, seqs, tokenizer, prefixes)
            _, grads = value_and_grad(batch_arrays(batch))
            mx.eval(grads)
            vectors[credit].append(flat(grads))
    model.eval()
    info = {"boards": boards, "groups": len({it.group for it in items}), "zero_variance_groups": skipped,
            "replies": len(items), "invalid_replies": sum(1 for t in out.replies if t.error is not None),
            "seconds": round(time.perf_counter() - t0, 1)}
    return vectors, info


def letter_credit(batch, seqs, tokenizer, prefixes: set[str]) -> np.ndarray:
    """The batch's per-token advantages with a reply that is not a word credited from its first wrong letter
    on: the tokens before the first letter at which no allowed word starts with the letters so far get 0
    (a candidate for a denser GRPO credit, measured here only)."""
    advantages = batch.advantages.copy()
    at = 0
    for q in seqs:
        reply = [int(t) for t, m in zip(q.tokens, q.mask) if m]
        letters, first_wrong = "", None
        for j, tok in enumerate(reply):
            piece = tokenizer.decode([tok]).strip().lower()
            if len(piece) == 1 and piece.isalpha():
                letters += piece
                if letters not in prefixes:
                    first_wrong = j
                    break
        if first_wrong is not None:
            advantages[at:at + first_wrong] = 0.0
        at += len(reply)
    return advantages


def sft_units(cfg, data: Path, examples: int, seed: int):
    import mlx.core as mx
    import mlx.nn as nn

    from wordle_mlx.llm.sft_loss import make_batch, mean_loss
    from wordle_mlx.stages.grpo import load_policy
    from wordle_mlx.stages.sft import tokenize
    from wordle_mlx.stages.data import read_sft_jsonl

    model, tokenizer, _ = load_policy(cfg)
    records = read_sft_jsonl(data / "train.jsonl")
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(records), size=min(examples, len(records)), replace=False)
    seqs = tokenize([records[i] for i in pick], tokenizer, data / "train.jsonl")
    value_and_grad = nn.value_and_grad(model, lambda batch: mean_loss(model, batch))
    model.train()
    vectors = []
    for s in seqs:
        _, grads = value_and_grad(make_batch([s], pad_to=1))
        mx.eval(grads)
        vectors.append(flat(grads))
    model.eval()
    return vectors, {"examples": len(seqs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="a GRPO config (turn mode); its model.start_adapter is the policy")
    ap.add_argument("--boards", type=int, default=8)
    ap.add_argument("--sft-data", type=Path, help="an SFT data folder (train.jsonl) to measure next to GRPO")
    ap.add_argument("--sft-examples", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, help="write the numbers as JSON")
    args = ap.parse_args()

    from wordle_mlx.blas import reexec_with_openblas
    reexec_with_openblas()
    from wordle_mlx.config import load_config
    from wordle_mlx.stages.grpo import GRPOConfig

    cfg = load_config(args.config, GRPOConfig)
    if cfg.rl.mode != "turn":
        raise SystemExit(f"{args.config}: rl.mode must be 'turn' (groups are G replies to one board)")
    result = {"config": args.config, "adapter": cfg.model.start_adapter}
    vectors, info = grpo_units(cfg, args.boards, args.seed)
    result["grpo_group"] = {**info, **noise_scale(vectors["sequence"])}
    result["grpo_group_letter_credit"] = noise_scale(vectors["letters"])
    if args.sft_data:
        vectors, info = sft_units(cfg, args.sft_data, args.sft_examples, args.seed)
        result["sft_example"] = {**info, **noise_scale(vectors)}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
