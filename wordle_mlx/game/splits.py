"""The one fixed split of the answer list into train, valid and test secrets.

Decided here and nowhere else: the answers are shuffled with `SPLIT_SEED` and cut into `TEST_SIZE`
test words, `VALID_SIZE` validation words, and the rest for training. Eval plays test words; data
generation and GRPO draw secrets from train (and validate on valid). The three sets are disjoint.
"""

from __future__ import annotations

import random
from typing import Sequence

from .words import answers as default_answers

SPLIT_SEED = 20260101
TEST_SIZE = 200
VALID_SIZE = 100
SPLITS = ("train", "valid", "test")


def split_answers(words: Sequence[str] | None = None, seed: int = SPLIT_SEED) -> dict[str, list[str]]:
    """{'train': [...], 'valid': [...], 'test': [...]}, each in shuffled (play) order."""
    words = sorted(words if words is not None else default_answers())
    rng = random.Random(seed)
    shuffled = list(words)
    rng.shuffle(shuffled)
    test_n = min(TEST_SIZE, len(shuffled) // 5)
    valid_n = min(VALID_SIZE, len(shuffled) // 10)
    return {
        "test": shuffled[:test_n],
        "valid": shuffled[test_n:test_n + valid_n],
        "train": shuffled[test_n + valid_n:],
    }


def split_words(name: str, words: Sequence[str] | None = None, seed: int = SPLIT_SEED) -> list[str]:
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")
    return split_answers(words, seed)[name]
