"""Wordle feedback: the exact repeated-letter rule, scalar and vectorised.

`feedback(guess, answer)` returns five characters over G (green), Y (yellow) and X (grey). Greens are
marked first; then, left to right, a letter is yellow only while the answer still has an unused copy
of it. A pattern is also coded as an integer 0-242 in base 3 (X=0, Y=1, G=2, first letter most
significant), so `pattern_matrix(guesses, answers)` holds every pattern of a guess list against an
answer list as uint8. The matrix is built in chunks of guesses with numpy only.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

GREEN, YELLOW, GREY = "G", "Y", "X"
_DIGIT = {GREY: 0, YELLOW: 1, GREEN: 2}
_CHAR = "XYG"
ALL_GREEN = 242
NUM_PATTERNS = 243
_POW3 = np.array([81, 27, 9, 3, 1], dtype=np.int32)


def feedback(guess: str, answer: str) -> str:
    """The feedback pattern of `guess` against `answer`, e.g. feedback('speed', 'abide') == 'XXYXY'."""
    if len(guess) != 5 or len(answer) != 5:
        raise ValueError(f"feedback needs two 5-letter words, got {guess!r} and {answer!r}")
    result = [GREY] * 5
    unused: dict[str, int] = {}
    for i in range(5):
        if guess[i] == answer[i]:
            result[i] = GREEN
        else:
            unused[answer[i]] = unused.get(answer[i], 0) + 1
    for i in range(5):
        if result[i] != GREEN and unused.get(guess[i], 0) > 0:
            result[i] = YELLOW
            unused[guess[i]] -= 1
    return "".join(result)


def pattern_to_code(pattern: str) -> int:
    return sum(_DIGIT[c] * int(p) for c, p in zip(pattern, _POW3))


def code_to_pattern(code: int) -> str:
    return "".join(_CHAR[(int(code) // int(p)) % 3] for p in _POW3)


def encode_words(words: Sequence[str]) -> np.ndarray:
    """Words as an (N, 5) uint8 array of letter indices 0-25."""
    if len(words) == 0:
        return np.zeros((0, 5), dtype=np.uint8)
    raw = np.frombuffer("".join(words).encode("ascii"), dtype=np.uint8)
    return (raw.reshape(len(words), 5) - ord("a")).astype(np.uint8)


def pattern_matrix(guesses: Sequence[str] | np.ndarray, answers: Sequence[str] | np.ndarray,
                   chunk: int = 64, progress=None, workers: int | None = None) -> np.ndarray:
    """uint8 matrix M[i, j] = pattern code of guesses[i] against answers[j].

    Rows are computed in chunks (small enough to stay in cache) on a thread pool of `workers`
    (default: the CPU count; numpy releases the GIL). `progress`, if given, is called with the number
    of guess rows finished after each block.
    """
    g = guesses if isinstance(guesses, np.ndarray) else encode_words(guesses)
    a = answers if isinstance(answers, np.ndarray) else encode_words(answers)
    out = np.empty((len(g), len(a)), dtype=np.uint8)
    workers = workers or os.cpu_count() or 1
    block = 1024
    if workers == 1 or len(g) <= block:
        _fill_patterns(g, a, out, chunk, progress)
        return out

    def fill(start: int) -> int:
        _fill_patterns(g[start:start + block], a, out[start:start + block], chunk, None)
        return min(block, len(g) - start)

    with ThreadPoolExecutor(workers) as pool:
        for done in pool.map(fill, range(0, len(g), block)):
            if progress is not None:
                progress(done)
    return out


def _fill_patterns(g: np.ndarray, a: np.ndarray, out: np.ndarray, chunk: int, progress) -> None:
    n_g, n_a = len(g), len(a)
    a_idx = np.arange(n_a)
    for start in range(0, n_g, chunk):
        gc = g[start:start + chunk]
        c = len(gc)
        green = gc[:, None, :] == a[None, :, :]                     # (c, A, 5)
        counts = np.zeros((c, n_a, 26), dtype=np.int8)                # unused answer letters
        for j in range(5):
            counts[:, a_idx, a[:, j]] += ~green[:, :, j]
        code = (green * (2 * _POW3).astype(np.uint8)).sum(axis=2, dtype=np.int32)
        rows = np.arange(c)[:, None]
        for i in range(5):
            letter = gc[:, i][:, None]                                # (c, 1)
            avail = counts[rows, a_idx[None, :], letter]               # (c, A)
            yellow = (~green[:, :, i]) & (avail > 0)
            counts[rows, a_idx[None, :], letter] = avail - yellow
            code += yellow * int(_POW3[i])
        out[start:start + c] = code
        if progress is not None:
            progress(c)


def pattern_row(guess: str, words: Sequence[str] | np.ndarray) -> np.ndarray:
    """Pattern codes of one guess against many words."""
    return pattern_matrix([guess], words)[0]
