"""Progress for long stages, on stderr so `--json` output on stdout stays clean.

In a terminal a stage shows a rich bar: steps done, elapsed time, ETA and the stage's own figures (loss,
tok/s, reward, win rate). Where stderr is a plain log (a file, a pipe, CI), a bar would only appear at the
end, so the same figures are printed as one line per update instead, at most one every few seconds, plus the
last one: `sft  3/12  25%  loss 2.310  48 tok/s  elapsed 0:41  eta 2:03`.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)
stdout = Console()

PLAIN_LINE_SECONDS = 5.0   # in a plain log, at most one progress line this often (and always the last)


def clock(seconds: float) -> str:
    """0:41, 12:03, 1:02:03."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class PlainProgress:
    """Progress as plain lines: done/total, percent, the stage's figures, elapsed time and ETA."""

    def __init__(self, description: str, total: int, write=None, now=time.monotonic,
                 every: float = PLAIN_LINE_SECONDS):
        self.description, self.total, self.done, self.info = description, total, 0, ""
        self.write = write or (lambda line: print(line, file=console.file, flush=True))
        self.now, self.every = now, every
        self.start = now()
        self.counted_from, self.started_at = 0, self.start   # the ETA uses the rate since the first advance
        self.last_line = None

    def advance(self, n: int = 1, info: str | None = None) -> None:
        if self.last_line is None and self.done == 0 and n > 0 and info is None:
            self.counted_from, self.started_at = n, self.now()   # a resumed run skips its finished steps at once
        self.done += n
        if info is not None:
            self.info = info
        t = self.now()
        if self.done >= self.total or self.last_line is None or t - self.last_line >= self.every:
            self.last_line = t
            self.write(self.line(t))

    def line(self, t: float) -> str:
        parts = [self.description, f"{self.done}/{self.total}"]
        if self.total:
            parts.append(f"{100 * self.done / self.total:.0f}%")
        if self.info:
            parts.append(self.info)
        parts.append(f"elapsed {clock(t - self.start)}")
        counted = self.done - self.counted_from
        if 0 < counted and self.done < self.total:
            parts.append(f"eta {clock((t - self.started_at) / counted * (self.total - self.done))}")
        return "  ".join(parts)


@contextlib.contextmanager
def progress_bar(description: str, total: int, enabled: bool = True) -> Iterator:
    """Yield `advance(n=1, info=None)`: a rich bar in a terminal, plain progress lines in a log, or nothing."""
    if not enabled:
        yield lambda n=1, info=None: None
        return
    if not console.is_terminal:
        yield PlainProgress(description, total).advance
        return
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(description, total=total, info="")

        def advance(n: int = 1, info: str | None = None) -> None:
            bar.update(task, advance=n, **({"info": info} if info is not None else {}))

        yield advance
