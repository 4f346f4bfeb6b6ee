"""Group-relative advantages for GRPO, in plain numpy: one number (or one per token) for each sampled reply.

`group_advantages` turns per-sample rewards and group ids into advantages, (r - mean) / (std + eps) or
r - mean; a group whose rewards are all equal gets exactly 0 and is reported as skipped (`spread_groups` finds
the groups with a spread, and raises on a non-finite reward). `expected_reward_advantages` is the
alternative of minimum risk training: each distinct reply of a group is weighted by its renormalised
probability, which makes the update the exact gradient of the expected reward over the group's replies.
`prefix_advantages` gives each token of a reply its own advantage: the change in the group's mean reward over
the replies that share the prefix up to it, so tokens every reply shares get 0 (the turn-mode alternative
that leaves the letters a group agrees on alone). `grpo_loss.py` packs these into token batches.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

ZERO_SPREAD = 1e-9


def no_spread(r: np.ndarray) -> bool:
    """True when the rewards `r` of one group are all equal (up to ZERO_SPREAD, relative): no advantage."""
    return bool(r.max() - r.min() <= ZERO_SPREAD * max(1.0, np.abs(r).max()))


def spread_groups(rewards: np.ndarray, groups: np.ndarray) -> tuple[list[np.ndarray], int]:
    """(the index arrays of the groups whose rewards differ, the number of groups whose rewards are all
    equal, which get no advantage); a non-finite reward raises."""
    if not np.all(np.isfinite(rewards)):
        raise ValueError(f"non-finite reward in {rewards.tolist()}")
    live, skipped = [], 0
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        if no_spread(rewards[idx]):
            skipped += 1
        else:
            live.append(idx)
    return live, skipped


def group_advantages(rewards: Sequence[float], groups: Sequence[int], scale: bool = True,
                     eps: float = 1e-4) -> tuple[np.ndarray, int]:
    """(advantage per sample, number of zero-variance groups) for rewards grouped by `groups`."""
    rewards = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(groups)
    if rewards.shape != groups.shape:
        raise ValueError(f"{len(rewards)} rewards for {len(groups)} group ids")
    out = np.zeros_like(rewards)
    live, skipped = spread_groups(rewards, groups)
    for idx in live:
        r = rewards[idx]
        centred = r - r.mean()
        out[idx] = centred / (r.std() + eps) if scale else centred
    return out, skipped


def expected_reward_advantages(rewards: Sequence[float], groups: Sequence[int], logprobs: Sequence[float],
                               keys: Sequence[object], sharpness: float = 1.0) -> tuple[np.ndarray, int]:
    """(advantage per sample, number of zero-variance groups) for minimum risk training over each group's set.

    Within a group, the distinct replies (equal `keys`) form a set S; each gets the weight
    Q(y) = p(y)^a / sum over S of p^a (p from the sequence log-probs `logprobs`, a = `sharpness`), and the
    advantage Q(y) (r(y) - sum over S of Q r), split evenly among its copies. With token-sum weights, the
    policy gradient with these advantages is exactly (1 / a) x the gradient of the expected reward sum Q r
    over S (Shen et al. 2016): unlike GRPO's sampled estimate, a reply counts once, by its probability, so an
    unlikely sample moves the policy little and a duplicated one no more than once.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    logprobs = np.asarray(logprobs, dtype=np.float64)
    groups = np.asarray(groups)
    if not (rewards.shape == groups.shape == logprobs.shape == (len(keys),)):
        raise ValueError(f"{len(rewards)} rewards, {len(logprobs)} log-probs and {len(keys)} keys for "
                         f"{len(groups)} group ids")
    if not np.all(np.isfinite(rewards)):
        raise ValueError(f"non-finite reward in {rewards.tolist()}")
    if not np.all(np.isfinite(logprobs)):
        raise ValueError(f"non-finite sequence log-prob in {logprobs.tolist()}")
    if not sharpness > 0:
        raise ValueError(f"sharpness must be > 0, got {sharpness}")
    out = np.zeros_like(rewards)
    skipped = 0
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        first: dict[object, int] = {}
        copies: dict[object, int] = {}
        for i in idx:
            first.setdefault(keys[i], i)
            copies[keys[i]] = copies.get(keys[i], 0) + 1
        uniq = list(first.values())
        r = rewards[uniq]
        if no_spread(r):
            skipped += 1
            continue
        z = sharpness * logprobs[uniq]
        q = np.exp(z - z.max())
        q /= q.sum()
        adv = dict(zip((keys[i] for i in uniq), q * (r - float(q @ r))))
        for i in idx:
            out[i] = adv[keys[i]] / copies[keys[i]]
    return out, skipped


def prefix_advantages(replies: Sequence[Sequence[int]], rewards: Sequence[float], groups: Sequence[int],
                      scale: bool = True, eps: float = 1e-4) -> tuple[list[np.ndarray | None], int]:
    """(per-token advantages of each reply, None for a zero-variance group; number of such groups).

    Within a group, V(p) is the mean reward of the replies that begin with the token prefix p (V of the empty
    prefix is the group mean), and token t of reply y gets V(y[:t + 1]) - V(y[:t]), divided by the group's
    reward std when `scale`. The tokens of a reply add up to V(y) - mean, GRPO's advantage (for a reply
    sampled once), but a token that every reply of the group shares (e.g. the first letters all replies
    agree on) gets 0: only the tokens where replies branch are pushed up or down, by how much the branch
    changed the mean reward (a per-group Monte-Carlo value at every prefix, as in tree-search RL for LLMs).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(groups)
    if not (rewards.shape == groups.shape == (len(replies),)):
        raise ValueError(f"{len(rewards)} rewards and {len(replies)} replies for {len(groups)} group ids")
    out: list[np.ndarray | None] = [None] * len(replies)
    live, skipped = spread_groups(rewards, groups)
    for idx in live:
        r = rewards[idx]
        div = (r.std() + eps) if scale else 1.0
        toks = [tuple(int(t) for t in replies[i]) for i in idx]
        value: dict[tuple, float] = {}

        def v(prefix: tuple) -> float:
            if prefix not in value:
                k = len(prefix)
                value[prefix] = float(np.mean([rj for tj, rj in zip(toks, r) if tj[:k] == prefix]))
            return value[prefix]

        for i, y in zip(idx, toks):
            out[i] = np.array([(v(y[:t + 1]) - v(y[:t])) / div for t in range(len(y))], dtype=np.float64)
    return out, skipped
