"""Progress bars and the shared rich console (stderr, so `--json` output on stdout stays clean)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)
stdout = Console()


@contextlib.contextmanager
def progress_bar(description: str, total: int, enabled: bool = True) -> Iterator:
    """Yield `advance(n=1, **fields)`; shows a rich bar on stderr when enabled and a terminal or CI log."""
    if not enabled:
        yield lambda n=1, **fields: None
        return
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(description, total=total, info="")

        def advance(n: int = 1, info: str | None = None) -> None:
            bar.update(task, advance=n, **({"info": info} if info is not None else {}))

        yield advance
