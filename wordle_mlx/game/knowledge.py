"""What the feedback so far tells a player, and which words are still possible.

`Knowledge.from_history` derives greens by position, yellow letters with the positions they are
known not to occupy, absent letters, and minimum and maximum counts per letter. `Knowledge.allows(w)`
checks a word against those facts; it agrees exactly with the definition of consistency used by
`candidates()` and `is_consistent()`: a word is consistent iff replaying the feedback of every earlier
guess against it reproduces every observed pattern.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from .feedback import GREEN, GREY, YELLOW, encode_words, feedback, pattern_row, pattern_to_code


@dataclass
class Knowledge:
    greens: dict[int, str] = field(default_factory=dict)          # position -> letter
    not_at: dict[str, set[int]] = field(default_factory=dict)     # letter -> positions it is not at
    min_count: dict[str, int] = field(default_factory=dict)
    max_count: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_history(cls, history: Iterable[tuple[str, str]]) -> "Knowledge":
        k = cls()
        for guess, pattern in history:
            present: dict[str, int] = {}
            greyed: set[str] = set()
            for i, (letter, mark) in enumerate(zip(guess, pattern)):
                if mark == GREEN:
                    k.greens[i] = letter
                    present[letter] = present.get(letter, 0) + 1
                else:
                    k.not_at.setdefault(letter, set()).add(i)
                    if mark == YELLOW:
                        present[letter] = present.get(letter, 0) + 1
                    elif mark == GREY:
                        greyed.add(letter)
            for letter, n in present.items():
                k.min_count[letter] = max(k.min_count.get(letter, 0), n)
            for letter in greyed:
                exact = present.get(letter, 0)
                k.max_count[letter] = min(k.max_count.get(letter, 5), exact)
        return k

    @property
    def absent(self) -> list[str]:
        """Letters known not to be in the word at all."""
        return sorted(letter for letter, n in self.max_count.items() if n == 0)

    @property
    def misplaced(self) -> dict[str, list[int]]:
        """Letters known to be in the word, with positions they are known not to occupy (0-based)."""
        out = {}
        for letter, n in sorted(self.min_count.items()):
            placed = sum(1 for l in self.greens.values() if l == letter)
            if n > placed:
                out[letter] = sorted(self.not_at.get(letter, set()) - set(self.greens))
        return out

    def allows(self, word: str) -> bool:
        for i, letter in self.greens.items():
            if word[i] != letter:
                return False
        for letter, positions in self.not_at.items():
            if any(word[i] == letter for i in positions):
                return False
        for letter, n in self.min_count.items():
            if word.count(letter) < n:
                return False
        for letter, n in self.max_count.items():
            if word.count(letter) > n:
                return False
        return True


def is_consistent(word: str, history: Iterable[tuple[str, str]]) -> bool:
    """True iff `word` could be the secret given every (guess, pattern) so far."""
    return all(feedback(guess, word) == pattern for guess, pattern in history)


def candidates(words: Sequence[str], history: Iterable[tuple[str, str]]) -> list[str]:
    """The words still consistent with the history, in their original order."""
    words = list(words)
    if not words:
        return []
    encoded = encode_words(words)
    keep = np.ones(len(words), dtype=bool)
    for guess, pattern in history:
        keep &= pattern_row(guess, encoded) == pattern_to_code(pattern)
    return [w for w, k in zip(words, keep) if k]
