"""What a GRPO step logs about its rewards: each component's mean and spread over the step's scored replies, from
every rank's values gathered as JSON (the games' rates come from `llm/play/games.py`). Plain numpy, no MLX.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...game.rewards import COMPONENTS


def value_stats(values: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Mean and std of each reward component over per-item value dicts (also gathered from several ranks)."""
    out = {}
    for name in COMPONENTS:
        v = np.array([d.get(name, 0.0) for d in values], dtype=np.float64)
        out[name] = {"mean": float(v.mean()) if len(v) else 0.0, "std": float(v.std()) if len(v) else 0.0}
    return out
