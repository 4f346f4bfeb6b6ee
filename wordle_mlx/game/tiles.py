"""Rich markup for coloured Wordle tiles (display only; nothing computes from this text)."""

from __future__ import annotations

_STYLE = {"G": "bold white on green", "Y": "bold black on yellow", "X": "bold white on grey37"}


def tiles(guess: str, pattern: str) -> str:
    return "".join(f"[{_STYLE[m]}] {c.upper()} [/]" for c, m in zip(guess, pattern))
