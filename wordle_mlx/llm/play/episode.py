"""What a played game leaves behind for the trainer: `Episode`s made of `Turn`s.

A `Turn` holds exactly what the model saw and did: the prompt token ids, the sampled completion token
ids with their log-probabilities under the sampling policy, the decoded text, the parsed guess or the
reply error, and the feedback when the guess was played. `Episode.token_sequences()` turns a game into
training sequences: one per turn, prompt tokens with mask 0 followed by completion tokens with mask 1,
with the rollout logprobs aligned to the completion tokens and the words on the board when the reply was written
(words decoding never offers them, so the trainer's letter masks leave them out too). Everything the environment or the prompt
contributes is masked, and so is every token grammar decoding forced; only the model's choices carry loss. This module does not import mlx.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ...game.state import GameState


@dataclass
class Turn:
    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]              # one per completion token (sampled token, rollout policy)
    text: str                          # decoded completion
    guess: str | None                  # parsed guess (may be invalid when error is set)
    error: str | None                  # reply error kind from prompts.REPLY_ERRORS, or None
    pattern: str | None = None         # feedback, when the guess was played
    repeated: bool = False             # the guess was already on the board
    consistent: bool | None = None     # played guess consistent with all earlier feedback
    finish_reason: str = "stop"        # "stop" (end token / closing tag) or "length" (hit max tokens)
    choice: list[int] | None = None    # grammar decoding: 1 for decoded tokens, 0 for forced ones (None: all decoded)


@dataclass
class TokenSequence:
    tokens: list[int]
    mask: list[int]                    # 1 for model tokens (loss), 0 for prompt/environment tokens
    logprobs: list[float]              # rollout logprobs aligned with `tokens` (0.0 where mask is 0)
    turn_index: int = 0
    excluded: tuple[str, ...] = ()     # the words on the board before this reply (words decoding's mask)


def reply_sequence(prompt: list[int], tokens: list[int], logprobs: list[float], choice: list[int] | None = None,
                   turn_index: int = 0, excluded: Sequence[str] = ()) -> TokenSequence:
    """The training sequence of one reply: the prompt (mask 0), then the reply's tokens with mask 1 where the
    model chose them. A forced token (grammar decoding) has mask 0; forced tokens after the last choice are
    left out, since nothing trained comes after them."""
    if len(logprobs) != len(tokens):
        raise ValueError(f"{len(logprobs)} logprobs for {len(tokens)} tokens")
    mask = [1] * len(tokens) if choice is None else list(choice)
    if len(mask) != len(tokens):
        raise ValueError(f"{len(mask)} choice flags for {len(tokens)} tokens")
    end = max((i + 1 for i, m in enumerate(mask) if m), default=0) if choice is not None else len(tokens)
    return TokenSequence(list(prompt) + list(tokens[:end]), [0] * len(prompt) + mask[:end],
                         [0.0] * len(prompt) + list(logprobs[:end]), turn_index, tuple(excluded))


@dataclass
class Episode:
    secret: str
    seeded: list[str]                  # guesses given in the prompt before the model played
    state: GameState                   # final board, seeded guesses included
    turns: list[Turn] = field(default_factory=list)
    group: int = 0                     # index of the prompt this game was played from (for GRPO groups)
    invalid_replies: int = 0
    timed_out: bool = False

    @property
    def won(self) -> bool:
        return self.state.won

    @property
    def model_guesses(self) -> list[str]:
        return self.state.guesses[len(self.seeded):]

    @property
    def completion_tokens(self) -> int:
        return sum(len(t.completion_tokens) for t in self.turns)

    def outcome(self) -> dict:
        """The per-game record logged in metrics (secret, won, guesses)."""
        return {"secret": self.secret, "won": self.won, "guesses": list(self.state.guesses),
                "seeded": len(self.seeded)}

    def token_sequences(self) -> list[TokenSequence]:
        out, board = [], list(self.seeded)
        for i, turn in enumerate(self.turns):
            try:
                out.append(reply_sequence(turn.prompt_tokens, turn.completion_tokens, turn.logprobs, turn.choice, i,
                                          board))
            except ValueError as exc:
                raise ValueError(f"turn {i} of {self.secret!r}: {exc}") from None
            if turn.pattern is not None:
                board.append(turn.guess)
        return out
