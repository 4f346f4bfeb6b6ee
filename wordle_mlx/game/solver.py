"""Greedy maximum-entropy Wordle solver: the teacher for synthetic data and the baseline in evals.

Each turn it keeps the answers consistent with the feedback so far and plays the allowed guess whose
feedback has the highest entropy over them. Ties (to 1e-9 bits) go to words that are still candidates,
then to the alphabetically first; with one or two candidates left it plays a candidate. Decisions are
memoised on the candidate set, so solving every answer is quick (docs/BENCHMARKS.md). It reads the answer list,
as every Wordle solver does; the LLM never sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .entropy import PatternTable, entropies
from .feedback import ALL_GREEN, code_to_pattern, pattern_to_code
from .state import MAX_GUESSES


@dataclass
class Solver:
    table: PatternTable
    _memo: dict[bytes, int] = field(default_factory=dict, repr=False)
    _candidate_memo: dict[bytes, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.answer_row = np.array([self.table.guess_index[w] for w in self.table.answers], dtype=np.int64)

    def candidate_columns(self, history: list[tuple[str, str]]) -> np.ndarray:
        """Answer columns consistent with every (guess, pattern) so far."""
        cols = np.arange(len(self.table.answers))
        for guess, pattern in history:
            row = self.table.matrix[self.table.guess_index[guess]]
            cols = cols[row[cols] == pattern_to_code(pattern)]
        return cols

    def ranked(self, cols: np.ndarray, top: int = 5) -> list[tuple[str, float, bool]]:
        """The best `top` guesses for this candidate set: (word, bits, is_candidate)."""
        bits = entropies(self.table.matrix, cols)
        is_cand = np.zeros(len(self.table.guesses), dtype=bool)
        is_cand[self.answer_row[cols]] = True
        order = np.lexsort((np.arange(len(bits)), ~is_cand, -np.round(bits, 9)))[:top]
        return [(self.table.guesses[i], float(bits[i]), bool(is_cand[i])) for i in order]

    def best_guess_row(self, cols: np.ndarray) -> int:
        if len(cols) == 0:
            raise ValueError("no candidate is consistent with the feedback")
        if len(cols) <= 2:
            return int(self.answer_row[cols[0]])
        key = cols.astype(np.int32).tobytes()
        if key not in self._memo:
            bits = np.round(entropies(self.table.matrix, cols), 9)
            best = bits.max()
            tied = np.flatnonzero(bits == best)
            cand_rows = set(self.answer_row[cols].tolist())
            in_cands = [r for r in tied if r in cand_rows]
            self._memo[key] = int(in_cands[0] if in_cands else tied[0])
        return self._memo[key]

    def best_candidate(self, cols: np.ndarray) -> str:
        """The candidate whose feedback splits the candidates best (ties to 1e-9 bits: the first in answer
        order), memoised on the candidate set."""
        if len(cols) == 0:
            raise ValueError("no candidate is consistent with the feedback")
        key = cols.astype(np.int32).tobytes()
        if key not in self._candidate_memo:
            bits = np.round(entropies(self.table.matrix[self.answer_row[cols]], cols), 9)
            self._candidate_memo[key] = int(cols[int(np.argmax(bits))])
        return self.table.answers[self._candidate_memo[key]]

    def next_guess(self, history: list[tuple[str, str]]) -> str:
        return self.table.guesses[self.best_guess_row(self.candidate_columns(history))]

    def play(self, secret: str, history: list[str] | None = None, max_guesses: int = MAX_GUESSES) -> list[str]:
        """Guesses the solver makes for `secret` (after an optional seeded history), ending on a win or the limit."""
        col = self.table.answer_index[secret]
        guesses = list(history or [])
        cols = np.arange(len(self.table.answers))
        for g in guesses:
            row = self.table.matrix[self.table.guess_index[g]]
            cols = cols[row[cols] == row[col]]
        if guesses and guesses[-1] == secret:
            return guesses
        while len(guesses) < max_guesses:
            row_idx = self.best_guess_row(cols)
            guesses.append(self.table.guesses[row_idx])
            code = self.table.matrix[row_idx, col]
            if code == ALL_GREEN:
                break
            cols = cols[self.table.matrix[row_idx, cols] == code]
        return guesses

    def pattern(self, guess: str, secret: str) -> str:
        return code_to_pattern(self.table.matrix[self.table.guess_index[guess], self.table.answer_index[secret]])
