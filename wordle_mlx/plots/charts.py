"""The single-run charts of `wordle-mlx plot --file metrics.jsonl`.

Each function takes a `RunLog` and returns a finished `Figure`, or None when the run has no data for it
(an SFT-only run has no rewards, a run without validation has no validation games, ...). SFT and GRPO steps have
the same kinds (`train`, `valid`), so the optimisation and validation charts ask `RunLog.is_sft` which run they
show. `RUN_CHARTS` lists them with their file names in the order they are written.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from .runlog import RunLog
from .stats import HISTOGRAM_KEYS, cumulative_wins, is_noisy, histogram_percent, outcome_histogram, rolling_win_rate
from .style import (SMOOTH_FROM, band, color, finish, integer_x, legend, line, new_figure, no_data, percent_y,
                    style_axes)

BAND_LIMIT = 4  # std bands are drawn only when at most this many reward components share the axes


def _game_sets(log: RunLog) -> list[tuple[str, list[int]]]:
    sets = [("train", log.train_outcomes()), ("valid", log.valid_outcomes())]
    return [(name, outcomes) for name, outcomes in sets if outcomes]


def _per_game_chart(log: RunLog, title: str, ylabel: str, curve) -> tuple[Figure, list] | None:
    """Train and validation games side by side (their counts differ by orders of magnitude)."""
    sets = _game_sets(log)
    if not sets:
        return None
    fig, axes = new_figure(1, len(sets))
    for i, (ax, (name, outcomes)) in enumerate(zip(axes, sets)):
        x, y, label = curve(outcomes)
        line(ax, x, y, f"{name}: {label}", color(i))
        style_axes(ax, f"{name} games", f"{name} games played", ylabel)
        integer_x(ax)
        legend(ax)
    return finish(fig, title, log.footnote()), axes


def cumulative_wins_chart(log: RunLog, window: int) -> Figure | None:
    def curve(outcomes):
        x, y = cumulative_wins(outcomes)
        return np.r_[0, x], np.r_[0, y], f"{int(y[-1])} wins / {len(x)} games"
    drawn = _per_game_chart(log, "Cumulative wins", "wins so far", curve)
    if drawn is None:
        return None
    for ax in drawn[1]:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
    return drawn[0]


def win_rate_chart(log: RunLog, window: int) -> Figure | None:
    def curve(outcomes):
        x, y = rolling_win_rate(outcomes, window)
        return x, y, f"{len(x)} games, last {min(window, len(x))}: {100 * y[-1]:.0f}%"
    drawn = _per_game_chart(log, f"Rolling win rate (last {window} games)", "win rate", curve)
    if drawn is None:
        return None
    for ax in drawn[1]:
        ax.set_ylim(-0.02, 1.02)
        percent_y(ax)
    return drawn[0]


def rewards_chart(log: RunLog, window: int) -> Figure | None:
    components = log.reward_components()
    total_steps, total = log.series("train", "reward_mean")
    if not components and not total:
        return None
    fig, (ax,) = new_figure()
    with_bands = len(components) <= BAND_LIMIT
    for i, (name, (steps, means, stds)) in enumerate(components.items()):
        line(ax, steps, means, name, color(i), smooth=True, raw=with_bands)
        if with_bands and any(s is not None for s in stds):
            m = np.asarray(means)
            s = np.asarray([np.nan if v is None else v for v in stds])
            band(ax, steps, m - s, m + s, color(i))
    if total:
        line(ax, total_steps, total, "total (reward_mean)", "black", smooth=True, linestyle="--", linewidth=1.3,
             raw=with_bands)
    smoothed = any(len(steps) > SMOOTH_FROM and is_noisy(means)
                   for steps, means in [(total_steps, total)] + [c[:2] for c in components.values()])
    notes = (["moving average"] if smoothed else []) + (["band = +-1 std"] if with_bands and components else [])
    title = "Reward components (mean per step" + "".join(f"; {n}" for n in notes) + ")"
    style_axes(ax, title, "step", "reward")
    integer_x(ax)
    legend(ax, outside=True)
    return finish(fig, None, log.footnote())


def _panels(log: RunLog, panels: list[tuple[str, str, str, bool]], title: str) -> Figure | None:
    data = [(log.series(kind, name), label, smooth) for kind, name, label, smooth in panels]
    if not any(steps for (steps, _), _, _ in data):
        return None
    fig, axes = new_figure(2, 2)
    for ax, ((steps, values), label, smooth), (kind, name, _, _) in zip(axes, data, panels):
        if not steps:
            no_data(ax, label)
            continue
        line(ax, steps, values, None, color(0), smooth=smooth, linewidth=1.3)
        style_axes(ax, label, "step", name)
        integer_x(ax)
        if name == "grad_norm" and min(values) > 0 and max(values) > 20 * float(np.median(values)):
            ax.set_yscale("log")  # a few huge spikes would flatten everything else
        elif name == "lr":
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2e}" if v else "0"))
    return finish(fig, title, log.footnote())


def training_chart(log: RunLog, window: int) -> Figure | None:
    if log.is_sft:
        return None
    return _panels(log, [("train", "loss", "loss", True), ("train", "kl", "KL to reference", True),
                         ("train", "grad_norm", "gradient norm", True), ("train", "lr", "learning rate", False)],
                   "GRPO optimisation")


def sft_training_chart(log: RunLog, window: int) -> Figure | None:
    if not log.is_sft:
        return None
    return _panels(log, [("train", "loss", "train loss", True), ("valid", "val_loss", "validation loss", False),
                         ("train", "lr", "learning rate", False), ("train", "tokens_per_second", "tokens / second", True)],
                   "SFT optimisation")


def guess_histogram_chart(log: RunLog, window: int) -> Figure | None:
    sets = _game_sets(log)
    if not sets:
        return None
    fig, (ax,) = new_figure()
    x = np.arange(len(HISTOGRAM_KEYS))
    width = 0.8 / len(sets)
    for i, (name, outcomes) in enumerate(sets):
        counts = outcome_histogram(outcomes)
        pct = histogram_percent(counts)
        offset = (i - (len(sets) - 1) / 2) * width
        bars = ax.bar(x + offset, [pct[k] for k in HISTOGRAM_KEYS], width, color=color(i),
                      label=f"{name} ({len(outcomes)} games)")
        ax.bar_label(bars, labels=[str(counts[k]) for k in HISTOGRAM_KEYS], fontsize=7, padding=1)
    ax.set_xticks(x, list(HISTOGRAM_KEYS))
    style_axes(ax, "Guesses used (bars: % of games, labels: counts)", "guesses to win", "share of games")
    percent_y(ax, 100.0)
    ax.set_ylim(0, max(5.0, ax.get_ylim()[1] * 1.08))
    legend(ax)
    return finish(fig, None, log.footnote())


def error_rates_chart(log: RunLog, window: int) -> Figure | None:
    fig, (ax,) = new_figure()
    drawn = 0
    sources = [("train", "-", True), ("valid", "--", False)]
    fields = [("format_error_rate", "format errors"), ("invalid_rate", "invalid words"), ("repeat_rate", "repeats")]
    for kind, style, smooth in sources:
        for i, (name, label) in enumerate(fields):
            steps, values = log.series(kind, name)
            if steps:
                line(ax, steps, values, f"{label} ({kind})", color(i), smooth=smooth, linestyle=style)
                drawn += 1
    if not drawn:
        return None
    style_axes(ax, "Format, invalid-word and repeat rates", "step", "rate")
    integer_x(ax)
    ax.set_ylim(bottom=-0.01)
    percent_y(ax)
    legend(ax, outside=True)
    return finish(fig, None, log.footnote())


def validation_chart(log: RunLog, window: int) -> Figure | None:
    """GRPO's validation passes: the win rate on the same validation words at each pass (the start adapter at step
    0; with empty and seeded boards, each kind's too), beside the share of the step's groups skipped for zero
    reward variance."""
    steps, rates = log.series("valid", "win_rate")
    if not steps or log.is_sft:
        return None
    fig, axes = new_figure(1, 2)
    games = [len(rec.get("games", [])) for rec in log.records["valid"] if rec.get("win_rate") is not None]
    line(axes[0], steps, rates, f"last: {100 * rates[-1]:.0f}% (best {100 * max(rates):.0f}% at step "
                                f"{steps[rates.index(max(rates))]}, {games[-1]} games a pass)", color(0))
    axes[0].plot(steps, rates, "o", color=color(0), markersize=3)
    kinds = [(kind, *log.series("valid", f"win_rate_{kind}")) for kind in ("empty", "seeded")]
    if all(kind_steps for _, kind_steps, _ in kinds):     # validation.history "both": each kind's curve too
        for i, (kind, kind_steps, kind_rates) in enumerate(kinds):
            axes[0].plot(kind_steps, kind_rates, "--", color=color(2 + i), label=f"{kind} boards: last "
                         f"{100 * kind_rates[-1]:.0f}%, first {100 * kind_rates[0]:.0f}%")
    style_axes(axes[0], "Validation wins (greedy, the same words each pass)", "step", "win rate")
    axes[0].set_ylim(-0.02, 1.02)
    percent_y(axes[0])
    integer_x(axes[0])
    legend(axes[0])
    skip_steps, share = log.series("train", "skipped_group_share")
    if skip_steps:
        line(axes[1], skip_steps, share, f"mean {100 * float(np.mean(share)):.0f}%", color(1), smooth=True)
        style_axes(axes[1], "Groups skipped (zero reward variance)", "step", "share of the step's groups")
        axes[1].set_ylim(-0.02, 1.02)
        percent_y(axes[1])
        integer_x(axes[1])
        legend(axes[1])
    else:
        no_data(axes[1], "skipped groups")
    return finish(fig, "GRPO validation", log.footnote())


RUN_CHARTS: list[tuple[str, Callable[[RunLog, int], Figure | None]]] = [
    ("validation.png", validation_chart),
    ("cumulative_wins.png", cumulative_wins_chart),
    ("win_rate.png", win_rate_chart),
    ("rewards.png", rewards_chart),
    ("training.png", training_chart),
    ("sft_training.png", sft_training_chart),
    ("guess_histogram.png", guess_histogram_chart),
    ("error_rates.png", error_rates_chart),
]
