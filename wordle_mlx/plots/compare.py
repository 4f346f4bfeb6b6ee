"""The charts of `wordle-mlx plot --compare`: cumulative wins and the win distribution, one series per input.

Inputs are `runlog.Series` (a run's validation or train games, an eval's `game_records`, optionally its
baselines). Cumulative wins need per-game records and skip series that only have a histogram; the
distribution chart is in percent so inputs with different game counts compare.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .runlog import Series
from .stats import HISTOGRAM_KEYS, cumulative_wins, histogram_percent
from .style import color, finish, integer_x, legend, line, new_figure, percent_y, style_axes


def footnote(series: list[Series]) -> str:
    return "  |  ".join(f"{s.label}: {s.footnote}" for s in series if s.footnote)


def compare_cumulative_chart(series: list[Series]) -> Figure | None:
    with_games = [(i, s) for i, s in enumerate(series) if s.outcomes]
    if not with_games:
        return None
    fig, (ax,) = new_figure()
    longest = max(len(s.outcomes) for _, s in with_games)
    ax.plot([0, longest], [0, longest], linestyle=":", color="0.6", linewidth=1.0, label="every game won")
    for i, s in with_games:
        x, y = cumulative_wins(s.outcomes)
        line(ax, x, y, f"{s.label}: {int(y[-1])}/{len(x)}", color(i))
    style_axes(ax, "Cumulative wins", "games played", "wins so far")
    integer_x(ax)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0, top=max(1.0, max(int(np.sum(np.asarray(s.outcomes) > 0)) for _, s in with_games) * 1.1))
    legend(ax)
    return finish(fig, None, footnote(series))


def compare_distribution_chart(series: list[Series]) -> Figure:
    fig, (ax,) = new_figure()
    x = np.arange(len(HISTOGRAM_KEYS))
    width = 0.8 / len(series)
    for i, s in enumerate(series):
        pct = histogram_percent(s.histogram)
        offset = (i - (len(series) - 1) / 2) * width
        ax.bar(x + offset, [pct[k] for k in HISTOGRAM_KEYS], width, color=color(i),
               label=f"{s.label} ({s.games} games)")
    ax.set_xticks(x, list(HISTOGRAM_KEYS))
    style_axes(ax, "Win distribution (% of each input's games)", "guesses to win", "share of games")
    percent_y(ax, 100.0)
    legend(ax, outside=True)
    return finish(fig, None, footnote(series))
