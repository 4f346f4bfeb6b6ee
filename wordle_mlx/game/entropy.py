"""Shannon entropy of each guess's feedback distribution, and the cached pattern table.

For a candidate set C and a guess g, the feedback pattern splits C into up to 243 buckets; the
entropy (bits) of that split is the expected information the guess gives when every candidate is
equally likely. `PatternTable` holds the uint8 pattern matrix of all allowed guesses against the
answers; it is cached as `.npz` in the user cache folder, keyed by a hash of the word lists, and
rebuilt (with a note) when the cached file is stale or unreadable.
"""

from __future__ import annotations

import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..storage.fileio import atomic_path, cache_dir
from .feedback import NUM_PATTERNS, encode_words, pattern_matrix
from .words import lists_hash


def entropies(matrix: np.ndarray, columns: np.ndarray | None = None, block: int = 512) -> np.ndarray:
    """Entropy in bits of each row's pattern distribution over the selected columns (uniform prior).

    Rows are processed in cache-sized blocks, faster than one giant bincount (timings: docs/BENCHMARKS.md).
    """
    if len(matrix) > block:
        return np.concatenate([entropies(matrix[s:s + block], columns, block) for s in range(0, len(matrix), block)])
    sub = matrix if columns is None else np.take(matrix, columns, axis=1)   # C order (matrix[:, cols] is F order)
    n_rows, n_cols = sub.shape
    if n_cols == 0:
        return np.zeros(n_rows)
    offsets = (np.arange(n_rows, dtype=np.int64) * NUM_PATTERNS)[:, None]
    counts = np.bincount((sub.astype(np.int64) + offsets).ravel(), minlength=n_rows * NUM_PATTERNS)
    counts = counts.reshape(n_rows, NUM_PATTERNS).astype(np.float64)
    p = counts / n_cols
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(p > 0, np.log2(np.where(p > 0, p, 1.0)), 0.0)
    return -(p * logs).sum(axis=1)


def entropy_of(guess_codes: np.ndarray) -> float:
    """Entropy in bits of one guess's pattern codes over a candidate set."""
    if len(guess_codes) == 0:
        return 0.0
    counts = np.bincount(guess_codes.astype(np.int64), minlength=NUM_PATTERNS)
    p = counts[counts > 0] / len(guess_codes)
    return float(-(p * np.log2(p)).sum())


@dataclass
class PatternTable:
    guesses: tuple[str, ...]
    answers: tuple[str, ...]
    matrix: np.ndarray  # (len(guesses), len(answers)) uint8

    def __post_init__(self) -> None:
        self.guess_index = {w: i for i, w in enumerate(self.guesses)}
        self.answer_index = {w: i for i, w in enumerate(self.answers)}

    @classmethod
    def build(cls, guesses: Sequence[str], answers: Sequence[str],
              progress: Callable[[int], None] | None = None) -> "PatternTable":
        guesses, answers = tuple(guesses), tuple(answers)
        return cls(guesses, answers, pattern_matrix(encode_words(guesses), encode_words(answers), progress=progress))

    @classmethod
    def cached(cls, guesses: Sequence[str], answers: Sequence[str], progress_factory=None,
               folder: Path | None = None) -> "PatternTable":
        """Load from the cache, or build and save.

        `progress_factory(total)`, if given, is a context manager yielding a per-chunk callback; it is
        entered only when the table has to be built.
        """
        guesses, answers = tuple(guesses), tuple(answers)
        path = (folder or cache_dir("patterns")) / f"patterns-{lists_hash(guesses, answers)}.npz"
        if path.exists():
            try:
                with np.load(path, allow_pickle=False) as data:
                    matrix = data["matrix"]
                    ok = (matrix.shape == (len(guesses), len(answers)) and
                          "\n".join(guesses) == str(data["guesses"]) and "\n".join(answers) == str(data["answers"]))
                if ok:
                    return cls(guesses, answers, matrix)
                print(f"note: pattern cache {path} does not match the word lists; rebuilding", file=sys.stderr)
            except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
                print(f"note: pattern cache {path} is unreadable ({type(exc).__name__}); rebuilding", file=sys.stderr)
        if progress_factory is None:
            table = cls.build(guesses, answers)
        else:
            with progress_factory(len(guesses)) as advance:
                table = cls.build(guesses, answers, advance)
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, matrix=table.matrix, guesses=np.array("\n".join(guesses)),
                         answers=np.array("\n".join(answers)))
        return table

    def answer_columns(self, words: Sequence[str]) -> np.ndarray:
        return np.array([self.answer_index[w] for w in words], dtype=np.int64)

    def entropies(self, candidate_columns: np.ndarray | None = None) -> np.ndarray:
        return entropies(self.matrix, candidate_columns)
