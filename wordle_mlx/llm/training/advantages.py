"""Group-relative advantages for GRPO, in plain numpy: one number for each sampled reply.

`group_advantages` turns per-sample rewards and group ids into advantages, (r - mean) / (std + eps); a
group whose rewards are all equal gets exactly 0 and is reported as skipped (`spread_groups` finds
the groups with a spread, and raises on a non-finite reward). `rl.py` drops the zero-advantage groups and
`packing.py` packs the rest into token batches.
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


def group_advantages(rewards: Sequence[float], groups: Sequence[int], eps: float = 1e-4) -> tuple[np.ndarray, int]:
    """(advantage per sample, number of zero-variance groups) for rewards grouped by `groups`: (r - mean) / std
    within a group, 0 in a group whose rewards do not differ."""
    rewards = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(groups)
    if rewards.shape != groups.shape:
        raise ValueError(f"{len(rewards)} rewards for {len(groups)} group ids")
    out = np.zeros_like(rewards)
    live, skipped = spread_groups(rewards, groups)
    for idx in live:
        r = rewards[idx]
        out[idx] = (r - r.mean()) / (r.std() + eps)
    return out, skipped
