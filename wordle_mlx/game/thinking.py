"""The short, truthful reasoning text written into SFT targets (`<think>...</think>`), from the game state only.

`think_text(history, candidates, guess, style)` describes the board and the teacher's choice. Every fact
in it follows from the history: the candidate count and the candidates named are exactly the words
still consistent with every (guess, pattern) so far (the caller passes that list; `check_candidates`
verifies it), the greens/yellows/greys come from `Knowledge`, and "splits them into N groups" is the
number of distinct feedback patterns the guess gives over the candidates. Styles:
- `none`: no think block (None);
- `brief`: one line, e.g. "12 words fit: plant, bland, gland and 9 more. Try plant.";
- `pattern`: one line built from letters only, no candidate list, e.g. "Pattern: _ l _ n t. Also: a.
  Out: r, s, e. Try plant." (greens in place, yellow letters, grey letters, then the guess). Every token
  before the guess is copied from the clues in the prompt, so the only word the model writes is the
  guess itself; with `brief` a 270M model invents the listed candidates and then copies a four-letter one;
- `full`: known letters, candidate count, a few candidates, and why the guess (it is a candidate, and/or
  how finely it splits the candidates).
Words are written in lower case: Gemma's tokenizer has one token for most lower-case English words
(" tract") but splits upper case into fragments (" T", "RACT"), and a small model asked to spell a word
in fragments makes up four- and six-letter "words". Pure: numpy/stdlib only, no mlx.
"""

from __future__ import annotations

from typing import Literal, Sequence

from .feedback import feedback
from .knowledge import Knowledge, is_consistent

ThinkStyle = Literal["none", "brief", "pattern", "full"]
THINK_STYLES = ("none", "brief", "pattern", "full")
MAX_NAMED = 5              # candidates a think text names before "and N more"


def split_groups(guess: str, candidates: Sequence[str]) -> int:
    """How many distinct feedback patterns `guess` gives over `candidates` (groups it splits them into)."""
    return len({feedback(guess, c) for c in candidates})


def named(candidates: Sequence[str]) -> str:
    """'bland, gland, plant and 9 more' (the first `MAX_NAMED` candidates in the given order)."""
    shown = ", ".join(candidates[:MAX_NAMED])
    rest = len(candidates) - min(len(candidates), MAX_NAMED)
    return f"{shown} and {rest} more" if rest else shown


def _count(n: int) -> str:
    return "1 word fits" if n == 1 else f"{n} words fit"


def known_letters(history: Sequence[tuple[str, str]]) -> str:
    """'Green: A at 2. Yellow: L (not 1). Grey: S, O.' from the feedback so far (empty parts left out)."""
    k = Knowledge.from_history(history)
    parts = []
    if k.greens:
        parts.append("Green: " + ", ".join(f"{l.upper()} at {p + 1}" for p, l in sorted(k.greens.items())) + ".")
    if k.misplaced:
        parts.append("Yellow: " + ", ".join(
            f"{l.upper()} (not {'/'.join(str(p + 1) for p in pos)})" if pos else l.upper()
            for l, pos in k.misplaced.items()) + ".")
    if k.absent:
        parts.append("Grey: " + ", ".join(c.upper() for c in k.absent) + ".")
    return " ".join(parts)


def letter_pattern(history: Sequence[tuple[str, str]]) -> str:
    """'Pattern: _ l _ n t. Also: a. Out: r, s, e.' (lower-case letters; empty parts left out, pattern always)."""
    k = Knowledge.from_history(history)
    parts = ["Pattern: " + " ".join(k.greens.get(p, "_") for p in range(5)) + "."]
    if k.misplaced:
        parts.append("Also: " + ", ".join(k.misplaced) + ".")
    if k.absent:
        parts.append("Out: " + ", ".join(k.absent) + ".")
    return " ".join(parts)


def think_text(history: Sequence[tuple[str, str]], candidates: Sequence[str], guess: str,
               style: ThinkStyle) -> str | None:
    """The reasoning for playing `guess` after `history`, given the still-consistent `candidates`."""
    if style == "none":
        return None
    if style not in THINK_STYLES:
        raise ValueError(f"unknown think style {style!r}; expected one of {', '.join(THINK_STYLES)}")
    if not candidates:
        raise ValueError("think_text needs at least one consistent candidate")
    n = len(candidates)
    is_candidate = guess in candidates
    if is_candidate:  # name the chosen candidate first, so the guess follows from the list it just wrote
        candidates = [guess] + [c for c in candidates if c != guess]
    if not history:
        if style in ("brief", "pattern"):
            return f"No clues yet. Try {guess}."
        return f"No clues yet; {_count(n)}. {guess} splits them into {split_groups(guess, candidates)} groups."
    if style == "pattern":
        return f"{letter_pattern(history)} Try {guess}."
    if style == "brief":  # one template for every count, so the model never has to pick among shapes
        return f"{_count(n)}: {named(candidates)}. Try {guess}."
    facts = known_letters(history)
    prefix = f"{facts} " if facts else ""
    if n == 1:
        return f"{prefix}Only {candidates[0]} fits."
    groups = split_groups(guess, candidates)
    if is_candidate:
        why = f"{guess} fits and splits them into {groups} groups."
    else:
        why = f"{guess} does not fit, but splits them into {groups} groups."
    return f"{prefix}{_count(n)}: {named(candidates)}. {why}"


def check_candidates(history: Sequence[tuple[str, str]], candidates: Sequence[str], words: Sequence[str]) -> str | None:
    """Why `candidates` is not exactly the consistent subset of `words` (None when it is)."""
    expected = [w for w in words if is_consistent(w, history)]
    if list(candidates) != expected:
        return f"expected {len(expected)} consistent words, got {len(candidates)}"
    return None
