"""What a GRPO step logs about its games: reward component means and spreads, and win, format, invalid and repeat
rates. Each rank counts its own games (`game_counts`, `value_stats` of its items' values); the counts and values
are gathered as JSON and combined here (`rates_from_counts`), so the metrics cover the whole batch whatever the
number of ranks. It calls no MLX itself: plain counting over `Episode`s and numpy means.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...game.rewards import COMPONENTS
from ..play.episode import Episode, Turn
from ..play.prompts import FORMAT_ERRORS, NOT_A_WORD


def value_stats(values: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Mean and std of each reward component over per-item value dicts (also gathered from several ranks)."""
    out = {}
    for name in COMPONENTS:
        v = np.array([d.get(name, 0.0) for d in values], dtype=np.float64)
        out[name] = {"mean": float(v.mean()) if len(v) else 0.0, "std": float(v.std()) if len(v) else 0.0}
    return out


def game_counts(episodes: Sequence[Episode], replies: Sequence[Turn]) -> dict:
    """The raw counts behind a batch of games' rates; counts from several ranks add up (`rates_from_counts`)."""
    return {"games": len(episodes), "won_guesses": [len(ep.state.guesses) for ep in episodes if ep.won],
            "replies": len(replies), "format_errors": sum(1 for t in replies if t.error in FORMAT_ERRORS),
            "invalid": sum(1 for t in replies if t.error == NOT_A_WORD),
            "repeated": sum(1 for ep in episodes for t in ep.turns if t.repeated),
            "played": sum(1 for ep in episodes for t in ep.turns if t.error is None)}


def rates_from_counts(parts: Sequence[dict]) -> dict:
    """win_rate, mean_guesses (won games, board guesses included), and rates as in `eval`: format errors and
    invalid words (well-formed, not allowed) over all replies, repeats over played guesses; over the union of
    the games behind several `game_counts` results."""
    games = sum(p["games"] for p in parts)
    won = [g for p in parts for g in p["won_guesses"]]
    n = max(1, sum(p["replies"] for p in parts))
    played = sum(p["played"] for p in parts)
    return {
        "win_rate": len(won) / games if games else 0.0,
        "mean_guesses": float(np.mean(won)) if won else None,
        "format_error_rate": sum(p["format_errors"] for p in parts) / n,
        "invalid_rate": sum(p["invalid"] for p in parts) / n,
        "repeat_rate": sum(p["repeated"] for p in parts) / played if played else 0.0,
    }
