"""GRPO rewards: small component functions of the game state, combined with checked weights.

Every component is computed from the board (the guesses and feedback before a reply), the parsed guess
and the kind of reply (`ReplyKind`: well-formed valid word, well-formed word not in the list, or a
format error); nothing here reads the text shown to the model. Components and their values:
`win` 1 if this guess wins; `early` (max_guesses - n) / (max_guesses - 1)
for a win in n board guesses; `format` +1 well-formed reply, -1 format error; `valid` 1 for a played
allowed word; `consistent` 1 if the played word fits all feedback so far; `info_gain` bits of the
guess's feedback distribution over the remaining candidates divided by log2(#candidates); `repeat` -1 for
a word already on the board; `length` -(completion tokens / max completion tokens). A reward is the
weighted sum of the values. `RewardWeights` refuses weights that would break the invariants the trainer
relies on: a format failure is a turn's worst outcome, an invalid or repeated word never scores above a
valid new one, and a winning reply outscores every other reply to its board (GRPO's group: the replies to one
board, which all win, if they win, at the same guess count, so `early` may be small). Any inconsistent input
or non-finite value raises; nothing is silently scored 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import Enum
from functools import lru_cache
from typing import Sequence

import numpy as np

from .entropy import entropy_of
from .feedback import encode_words, pattern_row, pattern_to_code
from .knowledge import is_consistent
from .state import MAX_GUESSES

GAME_COMPONENTS = ("win", "early")
TURN_COMPONENTS = ("format", "valid", "consistent", "info_gain", "repeat", "length")
COMPONENTS = GAME_COMPONENTS + TURN_COMPONENTS


class ReplyKind(str, Enum):
    VALID = "valid"              # well-formed, an allowed word: it was played
    NOT_A_WORD = "not_a_word"    # well-formed, but not in the allowed list
    FORMAT_ERROR = "format_error"


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the components; all finite and >= 0 (penalties carry their own sign)."""
    win: float = 1.0
    early: float = 1.0
    format: float = 0.05
    valid: float = 0.02
    consistent: float = 0.03
    info_gain: float = 0.05
    repeat: float = 0.05
    length: float = 0.0

    @classmethod
    def from_dict(cls, weights: dict) -> "RewardWeights":
        unknown = sorted(set(weights) - set(COMPONENTS))
        if unknown:
            raise ValueError(f"unknown reward component {unknown[0]!r}; known: {', '.join(COMPONENTS)}")
        out = cls(**{k: float(v) for k, v in weights.items()})
        out.check()
        return out

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"reward weight {f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"reward weight {f.name} must be >= 0 (penalties carry their own sign), got {value}")
        self.check_turn_invariants()

    def as_dict(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in COMPONENTS}

    def check(self) -> None:
        """Raise ValueError if these weights could break a reward invariant of GRPO's groups: the replies to one
        board. Every winning reply wins at the same guess count, so `early` is equal among them; a winner must
        still beat the best non-winning reply (full info_gain, no length cost)."""
        self.check_turn_invariants()
        if not self.win > self.info_gain + self.length:
            raise ValueError(f"reward weight win ({self.win}) must be > info_gain + length "
                             f"({self.info_gain} + {self.length}), or a winning reply could score below a "
                             "reply that does not win")

    def check_turn_invariants(self) -> None:
        """The invariants of a single reply: format failures worst, non-words never above words."""
        if self.win <= 0:
            raise ValueError(f"reward weight win must be > 0, got {self.win}")
        if self.format <= 0:
            raise ValueError(f"reward weight format must be > 0 so a format error is a turn's worst outcome, "
                             f"got {self.format}")
        # worst well-formed turns: a word not in the list, or a repeated word, both at max length
        worst_ok = min(self.format - self.length, self.format + self.valid - self.repeat - self.length)
        if not worst_ok > -self.format:
            raise ValueError(f"reward weights let a well-formed reply score as low as a format error: need "
                             f"2*format ({2 * self.format}) > length + max(0, repeat - valid) "
                             f"({self.length} + {max(0.0, self.repeat - self.valid)})")
        if self.length > self.valid:
            raise ValueError(f"reward weight length ({self.length}) must be <= valid ({self.valid}), or a long "
                             "valid word could score below a short invalid one")
        if self.length > self.repeat:
            raise ValueError(f"reward weight length ({self.length}) must be <= repeat ({self.repeat}), or a long "
                             "new word could score below a short repeated one")

    def total(self, values: dict[str, float]) -> float:
        """Weighted sum of component values; raises on an unknown component or a non-finite value."""
        out = 0.0
        for name, value in values.items():
            if name not in COMPONENTS:
                raise ValueError(f"unknown reward component {name!r}")
            if not math.isfinite(value):
                raise ValueError(f"reward component {name} is not finite: {value}")
            out += getattr(self, name) * value
        return out


@dataclass(frozen=True)
class TurnFacts:
    """One reply as the rewards see it: the board before it, what was guessed, and how long it was."""
    secret: str
    history: tuple[tuple[str, str], ...]     # (guess, pattern) on the board before this reply
    kind: ReplyKind
    guess: str | None                        # the played word when kind is VALID
    completion_tokens: int = 0
    max_completion_tokens: int = 0


class Rewards:
    """Scores turns and games against a candidate universe (the answer list)."""

    def __init__(self, weights: RewardWeights, answers: Sequence[str], max_guesses: int = MAX_GUESSES):
        weights.check()
        self.weights = weights
        self.max_guesses = max_guesses
        self.answers = tuple(answers)
        self._encoded = encode_words(self.answers)
        self._candidates = lru_cache(maxsize=4096)(self._candidate_rows)

    def _candidate_rows(self, history: tuple[tuple[str, str], ...]) -> np.ndarray:
        keep = np.ones(len(self.answers), dtype=bool)
        for guess, pattern in history:
            keep &= pattern_row(guess, self._encoded) == pattern_to_code(pattern)
        return np.flatnonzero(keep)

    # --- the components, one small function each -------------------------------------------------
    def format_value(self, t: TurnFacts) -> float:
        return -1.0 if t.kind is ReplyKind.FORMAT_ERROR else 1.0

    def valid_value(self, t: TurnFacts) -> float:
        return 1.0 if t.kind is ReplyKind.VALID else 0.0

    def consistent_value(self, t: TurnFacts) -> float:
        return 1.0 if t.kind is ReplyKind.VALID and is_consistent(t.guess, t.history) else 0.0

    def repeat_value(self, t: TurnFacts) -> float:
        return -1.0 if t.kind is ReplyKind.VALID and any(g == t.guess for g, _ in t.history) else 0.0

    def info_gain_value(self, t: TurnFacts) -> float:
        if t.kind is not ReplyKind.VALID or any(g == t.guess for g, _ in t.history):
            return 0.0
        rows = self._candidates(t.history)
        if len(rows) <= 1:
            return 1.0 if len(rows) == 1 and self.answers[rows[0]] == t.guess else 0.0
        codes = pattern_row(t.guess, self._encoded[rows])
        return entropy_of(codes) / math.log2(len(rows))

    def length_value(self, t: TurnFacts) -> float:
        if t.max_completion_tokens <= 0:
            return 0.0
        return -min(1.0, t.completion_tokens / t.max_completion_tokens)

    def early_value(self, won: bool, guesses: int) -> float:
        if not won:
            return 0.0
        if not 1 <= guesses <= self.max_guesses:
            raise ValueError(f"a won game needs 1..{self.max_guesses} guesses, got {guesses}")
        return (self.max_guesses - guesses) / max(1, self.max_guesses - 1)

    # --- combining ---------------------------------------------------------------------------------
    def check_turn(self, t: TurnFacts) -> None:
        if t.kind is ReplyKind.VALID and (not isinstance(t.guess, str) or len(t.guess) != 5):
            raise ValueError(f"a valid reply needs a 5-letter guess, got {t.guess!r}")
        if t.completion_tokens < 0:
            raise ValueError(f"completion_tokens must be >= 0, got {t.completion_tokens}")
        if len(t.history) >= self.max_guesses:
            raise ValueError(f"turn after {len(t.history)} guesses: the game was already over")

    def turn_values(self, t: TurnFacts) -> dict[str, float]:
        """Values of the per-turn components for one reply."""
        self.check_turn(t)
        return {"format": self.format_value(t), "valid": self.valid_value(t),
                "consistent": self.consistent_value(t), "info_gain": self.info_gain_value(t),
                "repeat": self.repeat_value(t), "length": self.length_value(t)}

    def turn_mode_values(self, t: TurnFacts) -> dict[str, float]:
        """The per-turn components plus win/early when this very guess wins (a GRPO group's reply)."""
        values = self.turn_values(t)
        won = t.kind is ReplyKind.VALID and t.guess == t.secret
        values["win"] = 1.0 if won else 0.0
        values["early"] = self.early_value(won, len(t.history) + 1)
        return values

    def total(self, values: dict[str, float]) -> float:
        return self.weights.total(values)
