"""Pure arithmetic behind the charts: cumulative wins, rolling win rate, guess histograms, Wilson intervals.

A game is reduced to one integer "outcome": the number of guesses (1-6) for a win, 0 for a loss. All
functions take sequences of outcomes (or numbers) and return numpy arrays or plain values, so they are
easy to check by hand; nothing here draws or reads files. `markdown_table` renders the headline rows of
`plot --compare`, and `paired_table` its paired comparisons: two players on the same secrets, compared by
the games one won and the other lost, with McNemar's exact test (two-sided binomial on the discordant games).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

HISTOGRAM_KEYS = ("1", "2", "3", "4", "5", "6", "lost")
Z95 = 1.959963984540054


def cumulative_wins(outcomes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """x = games played (1..N), y = wins so far after each game."""
    won = np.asarray(outcomes, dtype=np.int64) > 0
    return np.arange(1, len(won) + 1), np.cumsum(won)


def rolling_win_rate(outcomes: Sequence[int], window: int) -> tuple[np.ndarray, np.ndarray]:
    """x = games played, y = win rate over the last `window` games (fewer at the start)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    won = (np.asarray(outcomes, dtype=np.int64) > 0).astype(np.float64)
    n = len(won)
    x = np.arange(1, n + 1)
    csum = np.concatenate([[0.0], np.cumsum(won)])
    start = np.maximum(0, x - window)
    return x, (csum[x] - csum[start]) / (x - start)


def outcome_histogram(outcomes: Sequence[int]) -> dict[str, int]:
    """Counts of wins in 1..6 guesses and of losses, keyed like the eval JSON histogram."""
    hist = {key: 0 for key in HISTOGRAM_KEYS}
    for outcome in outcomes:
        hist["lost" if outcome == 0 else str(outcome)] += 1
    return hist


def histogram_percent(hist: dict[str, int]) -> dict[str, float]:
    total = sum(hist.get(k, 0) for k in HISTOGRAM_KEYS)
    return {k: (100.0 * hist.get(k, 0) / total if total else 0.0) for k in HISTOGRAM_KEYS}


def mean_guesses_on_wins(hist: dict[str, int]) -> float | None:
    wins = sum(hist.get(str(k), 0) for k in range(1, 7))
    if wins == 0:
        return None
    return sum(k * hist.get(str(k), 0) for k in range(1, 7)) / wins


def wilson_interval(wins: int, games: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default); (0, 1) when there are no games."""
    if games <= 0:
        return 0.0, 1.0
    p = wins / games
    denom = 1.0 + z * z / games
    centre = (p + z * z / (2 * games)) / denom
    half = z * math.sqrt(p * (1 - p) / games + z * z / (4 * games * games)) / denom
    lo = 0.0 if wins <= 0 else max(0.0, centre - half)
    hi = 1.0 if wins >= games else min(1.0, centre + half)
    return lo, hi


def weighted_mean(values: Sequence[float | None], weights: Sequence[float]) -> float | None:
    """Mean of the non-None values weighted by `weights`; None when nothing is left."""
    pairs = [(v, w) for v, w in zip(values, weights) if v is not None and w > 0]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def centered_mean(y: np.ndarray, window: int) -> np.ndarray:
    """Mean over the `window` points centred on each point (no lag), clipped to the series at its ends."""
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    csum = np.concatenate([[0.0], np.cumsum(y)])
    idx = np.arange(n)
    half = max(0, window // 2)
    start, stop = np.maximum(0, idx - half), np.minimum(n, idx + half + 1)
    return (csum[stop] - csum[start]) / (stop - start)


def is_noisy(y: np.ndarray, threshold: float = 0.1) -> bool:
    """True when the typical (median) step-to-step jump is large next to the overall spread: noise,
    not a trend. A clean falling loss or an LR schedule has tiny typical jumps even if a few are big."""
    y = np.asarray(y, dtype=np.float64)
    if len(y) < 3:
        return False
    spread = float(np.std(y))
    return spread > 0 and float(np.median(np.abs(np.diff(y)))) > threshold * spread


def bucket_mean(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Downsample to at most `max_points` by averaging consecutive buckets (x and y alike)."""
    n = len(x)
    if n <= max_points:
        return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    edges = np.linspace(0, n, max_points + 1).astype(np.int64)
    counts = np.diff(edges)
    xs = np.add.reduceat(np.asarray(x, dtype=np.float64), edges[:-1]) / counts
    ys = np.add.reduceat(np.asarray(y, dtype=np.float64), edges[:-1]) / counts
    return xs, ys


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def markdown_table(rows: list[dict]) -> str:
    """Headline numbers as a Markdown table; rate columns appear only when some row has them.

    Each row: label, games, wins, mean_guesses (or None), and optionally format_error_rate,
    invalid_rate, repeat_rate (None = not recorded).
    """
    rate_cols = [(key, title) for key, title in (("format_error_rate", "format errors"),
                                                 ("invalid_rate", "invalid"), ("repeat_rate", "repeats"))
                 if any(row.get(key) is not None for row in rows)]
    header = ["run", "games", "wins", "win rate (95% CI)", "mean guesses (wins)"] + [t for _, t in rate_cols]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for row in rows:
        games, wins = row["games"], row["wins"]
        lo, hi = wilson_interval(wins, games)
        rate = f"{100 * wins / games:.1f}% ({100 * lo:.1f}-{100 * hi:.1f})" if games else "-"
        mean = "-" if row.get("mean_guesses") is None else f"{row['mean_guesses']:.2f}"
        cells = [str(row["label"]).replace("|", "/"), str(games), str(wins), rate, mean]
        cells += [_pct(row.get(key)) for key, _ in rate_cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def mcnemar_exact_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: P(a split at least this uneven) for `only_a + only_b` fair coin flips."""
    n = only_a + only_b
    if only_a < 0 or only_b < 0:
        raise ValueError(f"discordant counts must be >= 0, got {only_a} and {only_b}")
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_counts(secrets_a: Sequence[str], won_a: Sequence[bool], secrets_b: Sequence[str],
                  won_b: Sequence[bool]) -> dict[str, int] | None:
    """{both, only_a, only_b, neither} over the games of two players on the same secrets (matched by secret and
    occurrence), or None when the two lists of secrets are not the same multiset."""
    def keyed(secrets, won):
        seen: dict[str, int] = {}
        out = {}
        for secret, w in zip(secrets, won):
            seen[secret] = seen.get(secret, 0) + 1
            out[(secret, seen[secret])] = bool(w)
        return out

    a, b = keyed(secrets_a, won_a), keyed(secrets_b, won_b)
    if len(secrets_a) != len(won_a) or len(secrets_b) != len(won_b) or set(a) != set(b):
        return None
    counts = {"both": 0, "only_a": 0, "only_b": 0, "neither": 0}
    for key, wa in a.items():
        wb = b[key]
        counts["both" if wa and wb else "only_a" if wa else "only_b" if wb else "neither"] += 1
    return counts


def paired_table(rows: list[dict]) -> str:
    """Markdown: each row against the first, on the same secrets. Row: label, secrets, won (lists)."""
    first = rows[0]
    lines = [f"Paired against {str(first['label']).replace('|', '/')} (same secrets; McNemar exact, two-sided):", "",
             "| run | games | won by both | only this one | only the first | p |", "|---|---:|---:|---:|---:|---:|"]
    for row in rows[1:]:
        c = paired_counts(first["secrets"], first["won"], row["secrets"], row["won"])
        if c is None:
            continue
        lines.append(f"| {str(row['label']).replace('|', '/')} | {sum(c.values())} | {c['both']} | {c['only_b']} | "
                     f"{c['only_a']} | {mcnemar_exact_p(c['only_a'], c['only_b']):.3g} |")
    return "\n".join(lines) + "\n" if len(lines) > 4 else ""
