"""Shared figure helpers: 8x4.5 in at 100 dpi, readable from 3 points to 10,000, saved atomically.

`line()` draws a series so that it stays legible at any length: markers for short series, a plain line
for medium ones, and for long noisy ones a faint raw line (bucket-averaged to at most `MAX_POINTS`) under
a bold centred moving average. `finish()` adds the footnote (run name and config hash) and lays the figure out;
`save_png()` writes through a temp file and rename so a failed draw never leaves a half-written PNG.
The Agg backend is selected before anything else from matplotlib is imported, and pyplot is never used
(figures are plain `Figure` objects, so nothing accumulates in global state).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import os  # noqa: E402
import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Sequence  # noqa: E402

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator, PercentFormatter  # noqa: E402

from ..storage.fileio import atomic_path  # noqa: E402
from .stats import bucket_mean, centered_mean, is_noisy  # noqa: E402

FIGSIZE = (8.0, 4.5)
DPI = 100
MARKER_LIMIT = 40      # series with at most this many points get markers
SMOOTH_FROM = 150      # noisy series longer than this get a moving average over a faint raw line
MAX_POINTS = 1500      # longer series are bucket-averaged down to this many points
FOOTNOTE_SIZE = 6.5    # points; the footnote has two lines at most, wrapped to the figure's width
RAW_POINTS = 400       # ... and the faint raw line under a moving average to this many (keeps PNGs small)
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
          "tab:gray", "tab:olive", "tab:cyan")


def color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def new_figure(nrows: int = 1, ncols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def line(ax, x: Sequence[float], y: Sequence[float], label: str | None, col: str, smooth: bool = False,
         linestyle: str = "-", linewidth: float = 1.6, raw: bool = True) -> None:
    """Draw one series legibly whatever its length (see module docstring).

    `smooth`: a possibly noisy series; when long and noisy, draw its moving average (and the faint raw
    line if `raw`); smooth trends (a falling SFT loss, a schedule) are drawn as they are.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(x)
    if n == 0:
        return
    if n <= MARKER_LIMIT:
        ax.plot(x, y, linestyle=linestyle, marker="o", markersize=3.5, color=col, label=label,
                linewidth=linewidth)
        return
    if smooth and n > SMOOTH_FROM and is_noisy(y):
        if raw:
            rx, ry = bucket_mean(x, y, RAW_POINTS)
            ax.plot(rx, ry, color=col, alpha=0.25, linewidth=0.7, rasterized=True)
        sx, sy = bucket_mean(x, centered_mean(y, max(5, n // 25)), MAX_POINTS)
        ax.plot(sx, sy, linestyle=linestyle, color=col, label=label, linewidth=linewidth)
        return
    bx, by = bucket_mean(x, y, MAX_POINTS)
    ax.plot(bx, by, linestyle=linestyle, color=col, label=label, linewidth=linewidth, rasterized=n > MAX_POINTS)


def band(ax, x: Sequence[float], lo: Sequence[float], hi: Sequence[float], col: str) -> None:
    """A light shaded band (e.g. mean +- std), downsampled like `line`."""
    x = np.asarray(x, dtype=np.float64)
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(lo) & np.isfinite(hi)
    if keep.sum() < 2:
        return
    bx, blo = bucket_mean(x[keep], lo[keep], MAX_POINTS)
    _, bhi = bucket_mean(x[keep], hi[keep], MAX_POINTS)
    ax.fill_between(bx, blo, bhi, color=col, alpha=0.12, linewidth=0, rasterized=True)


def integer_x(ax) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True, min_n_ticks=1))


def percent_y(ax, top: float = 1.0) -> None:
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=top, decimals=0))


def style_axes(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3, linewidth=0.6)


def legend(ax, outside: bool = False) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if outside:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    else:
        ax.legend(fontsize=8, loc="best", framealpha=0.8)


def no_data(ax, title: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes, color="0.5", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def finish(fig: Figure, title: str | None, footnote: str) -> Figure:
    if title:
        fig.suptitle(title, fontsize=11)
    width = int(0.97 * fig.get_figwidth() * 72 / (0.62 * FOOTNOTE_SIZE))   # characters: ~0.62 em each in DejaVu Sans
    lines = textwrap.wrap(footnote, width=width, max_lines=2, placeholder=" ...") or [""]
    fig.text(0.01, 0.012, "\n".join(lines), fontsize=FOOTNOTE_SIZE, color="0.35", ha="left", va="bottom")
    fig.tight_layout(rect=(0.0, 0.01 + 0.025 * len(lines), 1.0, 1.0))
    return fig


def save_png(fig: Figure, target: Path) -> Path:
    """Write `fig` to `target` atomically (temp file in the same folder, then rename)."""
    with atomic_path(target) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
        readable(tmp)
    return target


def readable(path: Path) -> None:
    """Give a temp file (created 0600) the permissions a normally created file would have."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
