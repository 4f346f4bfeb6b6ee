"""Game state: a secret, the guesses made so far and their feedback.

`GameState` is the single source of truth for rewards, prompts and metrics. It knows nothing about
text shown to a model. `check_guess` gives the reason a guess is not playable (not 5 letters a-z, not
an allowed word); whether an unplayable reply costs a turn is the caller's choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection

from .feedback import feedback
from .words import check_word

MAX_GUESSES = 6


def check_guess(word: str, allowed: Collection[str], list_name: str = "allowed word list") -> str | None:
    """Why `word` cannot be played (or is not in `allowed`, called `list_name`), or None when it can."""
    problem = check_word(word)
    if problem:
        return problem
    if word not in allowed:
        return f"{word!r} is not in the {list_name}"
    return None


@dataclass
class GameState:
    secret: str
    guesses: list[str] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)
    max_guesses: int = MAX_GUESSES

    def __post_init__(self) -> None:
        problem = check_word(self.secret)
        if problem:
            raise ValueError(f"bad secret: {problem}")
        if len(self.patterns) != len(self.guesses):
            self.patterns = [feedback(g, self.secret) for g in self.guesses]

    @classmethod
    def from_history(cls, secret: str, guesses: list[str], max_guesses: int = MAX_GUESSES) -> "GameState":
        state = cls(secret=secret, max_guesses=max_guesses)
        for guess in guesses:
            state.play(guess)
        return state

    def play(self, guess: str) -> str:
        """Record a (well-formed) guess and return its feedback pattern."""
        if self.over:
            raise ValueError(f"game for {self.secret!r} is already over")
        problem = check_word(guess)
        if problem:
            raise ValueError(f"cannot play {guess!r}: {problem}")
        pattern = feedback(guess, self.secret)
        self.guesses.append(guess)
        self.patterns.append(pattern)
        return pattern

    @property
    def turn(self) -> int:
        """Number of guesses made so far."""
        return len(self.guesses)

    @property
    def guesses_left(self) -> int:
        return self.max_guesses - len(self.guesses)

    @property
    def won(self) -> bool:
        return bool(self.guesses) and self.guesses[-1] == self.secret

    @property
    def lost(self) -> bool:
        return not self.won and len(self.guesses) >= self.max_guesses

    @property
    def over(self) -> bool:
        return self.won or self.lost

    def history(self) -> list[tuple[str, str]]:
        return list(zip(self.guesses, self.patterns))

    def copy(self) -> "GameState":
        return GameState(self.secret, list(self.guesses), list(self.patterns), self.max_guesses)
