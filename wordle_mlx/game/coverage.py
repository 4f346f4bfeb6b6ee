"""Answer coverage: for every answer word, the boards on which it is a fitting guess but not the secret.

A small model can lose held-out games by failing to *spell* the last candidate: it ends on non-words with exactly one
answer left (the secret); teaching it every answer as a guess targets that (docs/RESULTS.md, "Coverage labels"). A
board of a train secret often leaves other answers that fit every clue; guessing one of them is a good hard-mode
move. This module picks, for each word, the board (of a given set, e.g. an SFT data folder's) with the fewest
fitting answers on which the word fits, is not the secret and was not guessed yet. Words are all treated alike, so
the model learns to name every answer the way the solver knows its candidate list; secrets stay those of the boards
(never test words). Pure numpy over the precomputed pattern table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from .feedback import feedback
from .solver import Solver


@dataclass(frozen=True)
class CoverageExample:
    word: str                   # the label: an answer that fits the board
    secret: str                 # the board's secret (another word)
    history: tuple[str, ...]    # the guesses so far
    candidates: int             # answers that fit the board, the secret and `word` included


def coverage_examples(boards: Iterable[tuple[str, Sequence[str]]], words: Sequence[str], solver: Solver,
                      max_candidates: int | None = None) -> tuple[list[CoverageExample], list[str]]:
    """(examples, uncovered words): for each of `words` (answer words), the board from `boards` ((secret,
    guesses) pairs; duplicates are ignored) on which it fits every clue, is not the secret and was not guessed,
    with the fewest fitting answers (ties: the order of `boards`), and only boards with at most
    `max_candidates` fitting answers when given. Examples come in the order of `words`; uncovered words fit no
    such board."""
    if max_candidates is not None and max_candidates < 2:
        raise ValueError(f"max_candidates must be at least 2 (the secret and the word), got {max_candidates}")
    answers = solver.table.answers
    index = {w: i for i, w in enumerate(answers)}
    missing = [w for w in words if w not in index]
    if missing:
        raise ValueError(f"{missing[0]!r} is not an answer word (coverage labels must fit as answers)")
    distinct = list(dict.fromkeys((secret, tuple(guesses)) for secret, guesses in boards))
    fitting = []
    for secret, guesses in distinct:
        cols = solver.candidate_columns([(g, feedback(g, secret)) for g in guesses])
        fitting.append(cols)
    order = sorted((b for b in range(len(distinct)) if max_candidates is None or len(fitting[b]) <= max_candidates),
                   key=lambda b: (len(fitting[b]), b))
    wanted = {index[w] for w in words}
    found: dict[int, int] = {}          # answer column -> its board
    for b in order:
        secret, guesses = distinct[b]
        for col in fitting[b]:
            col = int(col)
            if col in wanted and answers[col] != secret and answers[col] not in guesses:
                found.setdefault(col, b)
    examples = [CoverageExample(w, distinct[found[index[w]]][0], distinct[found[index[w]]][1],
                                len(fitting[found[index[w]]])) for w in words if index[w] in found]
    return examples, [w for w in words if index[w] not in found]
