"""`wordle-mlx plot`: PNG charts of one run's metrics.jsonl, or a comparison of runs and eval results.

`--file logs/<run>/metrics.jsonl` writes the single-run charts (cumulative wins, rolling win rate,
reward components, optimiser panels, guess histogram, error rates; charts without data are skipped)
into `--out` (default `plots/` beside the file). `--compare A B ...` takes run metrics files (their
validation games, else their train games) and eval JSON files (their `game_records`, plus
`baselines` with `--with-baselines`), and writes cumulative wins, a percentage win-distribution chart
and `compare.md`, a Markdown table of headline numbers with Wilson 95% intervals and, for eval results
played on the same secrets as the first input, a paired table (games only one of the two won, McNemar's
exact p). Every input is read
and checked before any figure is drawn, and figures are drawn before any is written, so bad input
never leaves PNGs behind. Paths are printed one per line (or as JSON with `--json`).
"""

from __future__ import annotations


from pydantic import Field

from ..config import StrictModel, display_path, resolve_path
from ..errors import UserError
from ..storage.fileio import atomic_path
from ..runtime.progress import console
from ..plots.charts import RUN_CHARTS
from ..plots.compare import compare_cumulative_chart, compare_distribution_chart
from ..plots.runlog import Series, load_run, load_series
from ..plots.stats import markdown_table, paired_table, wilson_interval
from ..plots.style import readable, save_png

LIST_OPTIONS = ("--compare", "--labels")


class PlotConfig(StrictModel):
    file: str | None = None
    compare: list[str] = Field(default_factory=list)
    labels: list[str] = Field(default_factory=list)
    out: str | None = None
    window: int = Field(default=50, ge=1)
    with_baselines: bool = False
    json_output: bool = False


def list_option_values(argv: list[str], extra: list[str], names: tuple[str, ...] = LIST_OPTIONS) -> dict[str, list[str]]:
    """The values of the options that take several (`--compare A B --labels X Y`, or `--compare=A`) from the
    command line's words `argv`: every word after such an option up to the next option. `extra` are the words
    the parser left over (the second and later values); one that no such option claims is an error."""
    values: dict[str, list[str]] = {name: [] for name in names}
    current: str | None = None
    for word in argv:
        name, eq, value = word.partition("=")
        if name in names:
            current = name
            if eq:
                values[name].append(value)
        elif word.startswith("-") and len(word) > 1 and not word[1:2].isdigit():
            current = None          # another option; the parser reads its value
        elif current is not None:
            values[current].append(word)
    claimed = [w for v in values.values() for w in v]
    for word in extra:
        if word not in claimed:
            raise UserError(f"plot: unexpected argument {word!r}; use --file FILE or --compare A B ...")
    return values


def run(cfg: PlotConfig) -> dict:
    if cfg.file and cfg.compare:
        raise UserError("plot: give either --file or --compare, not both")
    if cfg.file:
        if cfg.labels:
            raise UserError("plot: --labels goes with --compare")
        return plot_run(cfg)
    if cfg.compare:
        return plot_compare(cfg)
    raise UserError("plot: give --file logs/<run>/metrics.jsonl or --compare A B ...")


def plot_run(cfg: PlotConfig) -> dict:
    path = resolve_path(cfg, cfg.file)
    log = load_run(path)
    out = resolve_path(cfg, cfg.out) if cfg.out else path.parent / "plots"
    drawn = [(name, chart(log, cfg.window)) for name, chart in RUN_CHARTS]
    if all(fig is None for _, fig in drawn):
        raise UserError(f"{path}: no games, rewards, losses or rates to plot in its step records")
    files = [display_path(save_png(fig, out / name)) for name, fig in drawn if fig is not None]
    skipped = [name for name, fig in drawn if fig is None]
    if not cfg.json_output:
        if skipped:
            console.print(f"[dim]no data for: {', '.join(skipped)}[/dim]")
        print("\n".join(files))
    return {"files": files, "skipped": skipped}


def _unique_series(series: list[Series]) -> list[Series]:
    """Drop repeated identical series (the same baseline in several eval files); make labels unique."""
    seen: set = set()
    kept: list[Series] = []
    for s in series:
        key = (s.label, tuple(sorted(s.histogram.items())), tuple(s.outcomes or ()))
        if key not in seen:
            seen.add(key)
            kept.append(s)
    repeated = {s.label for s in kept if sum(t.label == s.label for t in kept) > 1}
    for s in kept:
        if s.label in repeated and s.baseline_of:
            s.label = f"{s.label[:-1]} of {s.baseline_of})" if s.label.endswith(")") else f"{s.label} ({s.baseline_of})"
    counts: dict[str, int] = {}
    for s in kept:
        counts[s.label] = counts.get(s.label, 0) + 1
        if counts[s.label] > 1:
            s.label = f"{s.label} #{counts[s.label]}"
    return kept


def plot_compare(cfg: PlotConfig) -> dict:
    if cfg.labels and len(cfg.labels) != len(cfg.compare):
        raise UserError(f"plot: {len(cfg.labels)} --labels for {len(cfg.compare)} --compare inputs; "
                        "give one label per input")
    paths = [resolve_path(cfg, p) for p in cfg.compare]
    labels = cfg.labels or [None] * len(paths)
    series = _unique_series([s for path, label in zip(paths, labels)
                             for s in load_series(path, label, cfg.with_baselines)])
    rows = [s.row() for s in series]
    for row in rows:
        row["win_rate"] = row["wins"] / row["games"]
        row["win_rate_ci95"] = list(wilson_interval(row["wins"], row["games"]))
    table = markdown_table(rows)
    paired = [{"label": s.label, "secrets": s.secrets, "won": [o > 0 for o in s.outcomes]}
              for s in series if s.secrets is not None]          # secrets come only with game records
    extra = paired_table(paired) if series[0].secrets is not None else ""   # "" when nothing pairs with it
    if extra:
        table += "\n" + extra
    out = resolve_path(cfg, cfg.out) if cfg.out else paths[0].parent / "plots"
    drawn = [("compare_cumulative_wins.png", compare_cumulative_chart(series)),
             ("compare_win_distribution.png", compare_distribution_chart(series))]
    files = [display_path(save_png(fig, out / name)) for name, fig in drawn if fig is not None]
    with atomic_path(out / "compare.md") as tmp:
        tmp.write_text(table, encoding="utf-8")
        readable(tmp)
    files.append(display_path(out / "compare.md"))
    if not cfg.json_output:
        print(table)
        print("\n".join(files))
    return {"files": files, "skipped": [name for name, fig in drawn if fig is None], "rows": rows, "table": table}
