"""The pattern table the stages play and teach with, loaded by word-list name with a progress bar while it builds.

`load_table` is the one way a stage (entropy, solve, data, self-play, cover, train, eval, play) gets the
table of every allowed guess against the candidates: the answers by default, or all allowed words. The table
itself and its cache are the game's (`game/entropy.py`, stdlib and numpy only); the bar is the terminal's
(`runtime/progress.py`), which is why this small module sits here, beside the stages, and is not one of them.
"""

from __future__ import annotations

from ..game.entropy import PatternTable
from ..game.words import guess_list, load_word_list
from ..runtime.progress import progress_bar


def load_table(answers_list: str = "answers", allowed_list: str = "allowed",
               candidates: str = "answers", show_progress: bool = True) -> PatternTable:
    """The cached pattern table of all guesses against the candidate set, with a progress bar while building."""
    guesses = guess_list(answers_list, allowed_list)
    cands = load_word_list(answers_list) if candidates == "answers" else guesses

    return PatternTable.cached(
        guesses, cands, progress_factory=lambda total: progress_bar("pattern matrix", total, enabled=show_progress))
