"""Prompts shown to the model and the strict parser for its replies.

The system prompt states the rules and the output format (`<think>reasoning</think>` then
`<guess>word</guess>`). Each user message states the game in plain English: every earlier guess with
its feedback, letters known in place, letters in the word but not at given positions, letters ruled
out, and guesses left. Two settings (`PromptConfig`): whether the think block is required, and whether
the prompt carries the whole conversation (`context="conversation"`) or a fresh state summary each
turn (`context="summary"`); the prompt `style`: "full" (the rules, then every guess with its colours and
the derived letters, as above) or "compact" (a one-line instruction and only the derived clues, e.g.
"Pattern: _ e t _ _ / Has: r (not 1) / Not: a b d i", a fraction of the full prompt's tokens: on a CPU every
prompt token costs training and rollout time, and the model reads the clues instead of working them out); and
the `guess_format` the instruction asks for (the defaults: no think block, compact, letters, the shipped 270M
adapter's): a word (`<guess>crane</guess>`) or
its letters (`<guess> c r a n e</guess>`, which a small model writes as five single-letter tokens that
line up with the pattern's letters). The parser never raises on model output; it returns the guess or
the kind of error, and it reads both guess formats. This module renders text only; it does not tokenize (the
rollout engine and the SFT data both go through the tokenizer's chat template). It does not import mlx, so data
generation can use it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Literal, Sequence

from pydantic import Field

from ...config import StrictModel
from ...errors import UserError
from ...game.knowledge import Knowledge

Context = Literal["summary", "conversation"]
PromptStyle = Literal["full", "compact"]
GuessFormat = Literal["word", "letters"]
RejectedWord = Literal["upper", "letters"]
RetryContext = Literal["last", "turn"]

# Kinds of reply errors. The first four are format errors; NOT_A_WORD is a well-formed but invalid guess.
MISSING_THINK = "missing_think"
MISSING_GUESS = "missing_guess"
MULTIPLE_GUESSES = "multiple_guesses"
NOT_FIVE_LETTERS = "not_five_letters"
NOT_A_WORD = "not_a_word"
FORMAT_ERRORS = (MISSING_THINK, MISSING_GUESS, MULTIPLE_GUESSES, NOT_FIVE_LETTERS)
REPLY_ERRORS = FORMAT_ERRORS + (NOT_A_WORD,)

_MARK_WORDS = {"G": "green", "Y": "yellow", "X": "grey"}


class PromptConfig(StrictModel):
    require_think: bool = Field(False, description="Reply must contain <think>...</think> before <guess>.")
    context: Context = Field("summary", description="'summary': fresh state each turn; 'conversation': full chat.")
    style: PromptStyle = Field("compact", description="'full': rules, every guess and the derived letters; "
                               "'compact': one instruction line and the derived clues only.")
    guess_format: GuessFormat = Field("letters", description="What the instruction asks inside <guess>: the word, "
                                      "or its five letters separated by spaces.")
    rejected_word: RejectedWord = Field("upper", description="How the retry message shows a reply that is not in "
                                        "the word list: 'upper' ('BOIND is not in the word list.') or 'letters' "
                                        "('Not in the word list: b o i n d.', the same single-letter tokens as a "
                                        "letters reply).")
    retry_context: RetryContext = Field("last", description="Which invalid replies a summary-mode retry prompt "
                                        "reports: 'last' (only the last one) or 'turn' (every invalid reply "
                                        "since the last played guess, one line each, oldest first). With 'last' "
                                        "a repeated invalid reply gives the same prompt again, so greedy play "
                                        "repeats it until the game's invalid replies run out.")


ADAPTER_PROMPT_KEY = "wordle_prompt"   # adapter_config.json: the PromptConfig the adapter was trained with


def adapter_prompt(adapter_dir: str | Path | None) -> PromptConfig | None:
    """The prompt settings saved with an adapter by `wordle-mlx sft`/`train`, or None (none saved)."""
    if adapter_dir is None:
        return None
    path = Path(adapter_dir) / "adapter_config.json"
    try:
        raw = json.loads(path.read_text()).get(ADAPTER_PROMPT_KEY)
    except (OSError, ValueError, AttributeError):
        return None      # a missing or broken adapter is reported by the model loader, with its own message
    if raw is None:
        return None
    try:
        return PromptConfig(**raw)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{path}: {ADAPTER_PROMPT_KEY}: {' '.join(str(exc).split())[:200]}") from None


def choose_prompt(configured: PromptConfig, explicit: bool, adapter_dir: str | Path | None) -> PromptConfig:
    """The prompt to play with: the configured one when the user set it, else the adapter's, else the default."""
    if explicit:
        return configured
    return adapter_prompt(adapter_dir) or configured


def guess_example(cfg: PromptConfig) -> str:
    return "<guess> w o r d s</guess>" if cfg.guess_format == "letters" else "<guess>word</guess>"


def system_prompt(cfg: PromptConfig) -> str:
    """The rules and the reply format, kept short: on a CPU every prompt token costs training time."""
    if cfg.style == "compact":
        think = "<think>reasoning</think>" if cfg.require_think else ""
        return f"Wordle: find the secret 5-letter word. Reply {think}{guess_example(cfg)}"
    think = ("Think briefly in <think> </think>, then guess:" if cfg.require_think else
             "You may think briefly in <think> </think>; then guess:")
    return (
        "You are playing Wordle: find the secret 5-letter English word in 6 guesses. "
        "Each guess must be a real 5-letter word. Feedback per letter: green = right letter, right spot; "
        "yellow = in the word, another spot; grey = not in the word (or no more copies of it).\n"
        f"{think}\n<think>your reasoning</think>\n{guess_example(cfg)}"
    )


def describe_clues(history: Sequence[tuple[str, str]]) -> str:
    """The compact state: the clues derived from the feedback so far, in lower case, one line each.

    'Pattern: _ e t _ _' (greens in place), 'Has: r (not 1), o (not 3 4)' (letters in the word, with
    the positions they are known not to take), 'Not: a b d' (letters not in the word); empty parts are
    left out. These are exactly `Knowledge`'s greens, misplaced and absent letters."""
    if not history:
        return "No clues yet."
    k = Knowledge.from_history(history)
    lines = ["Pattern: " + " ".join(k.greens.get(p, "_") for p in range(5))]
    if k.misplaced:
        lines.append("Has: " + ", ".join(f"{letter} (not {' '.join(str(p + 1) for p in positions)})" if positions
                                         else letter for letter, positions in k.misplaced.items()))
    if k.absent:
        lines.append("Not: " + " ".join(k.absent))
    return "\n".join(lines)


def describe_state(history: Sequence[tuple[str, str]], max_guesses: int = 6, style: PromptStyle = "full") -> str:
    """The game so far (what a player sees, nothing more): in plain English, or the compact clues."""
    if style == "compact":
        return describe_clues(history)
    if not history:
        return f"This is the start of the game: no guesses yet. You have {max_guesses} guesses.\nMake your first guess."
    lines = ["Your guesses so far:"]
    for i, (guess, pattern) in enumerate(history, start=1):
        marks = " ".join(f"{c.upper()}={_MARK_WORDS[m]}" for c, m in zip(guess, pattern))
        lines.append(f"{i}. {guess.upper()}: {marks}")
    k = Knowledge.from_history(history)
    greens = ", ".join(f"{letter.upper()} at {pos + 1}" for pos, letter in sorted(k.greens.items()))
    misplaced = ", ".join(
        f"{letter.upper()} (not at {' or '.join(str(p + 1) for p in positions)})" if positions else letter.upper()
        for letter, positions in k.misplaced.items())
    lines.append(f"Letters in the right spot: {greens or 'none yet'}.")
    lines.append(f"Letters in the word but not in those spots: {misplaced or 'none yet'}.")
    lines.append(f"Letters not in the word: {', '.join(c.upper() for c in k.absent) or 'none yet'}.")
    left = max_guesses - len(history)
    lines.append(f"You have {left} guess{'es' if left != 1 else ''} left. Make your next guess.")
    return "\n".join(lines)


@dataclass
class TurnText:
    """One earlier turn as the conversation context needs it."""
    reply: str                   # the model's raw reply text
    guess: str | None            # the parsed guess, if any
    pattern: str | None          # feedback for it, if it was played
    error: str | None = None     # reply error kind, if any


def error_message(error: str, guess: str | None, rejected_word: RejectedWord = "upper") -> str:
    if error == NOT_A_WORD and rejected_word == "letters":
        return f"Not in the word list: {' '.join(guess or '')}."
    return {
        MISSING_THINK: "Your reply had no <think> </think> block before the guess.",
        MISSING_GUESS: "Your reply had no <guess> </guess> tag.",
        MULTIPLE_GUESSES: "Your reply had more than one <guess> tag.",
        NOT_FIVE_LETTERS: f"Your guess {guess!r} is not 5 letters a-z.",
        NOT_A_WORD: f"{(guess or '').upper()} is not in the word list.",
    }.get(error, "Your reply was not valid.")


def build_messages(cfg: PromptConfig, history: Sequence[tuple[str, str]], turns: Sequence[TurnText] = (),
                   max_guesses: int = 6, last_error: tuple[str, str | None] | None = None,
                   earlier_errors: Sequence[tuple[str, str | None]] = ()) -> list[dict]:
    """Chat messages for the next model turn.

    `history` is every (guess, pattern) on the board, seeded ones included. In conversation mode, `turns`
    are this game's earlier model turns (their replies are replayed as assistant messages); seeded guesses
    appear in the first user message. `last_error` (kind, guess) notes an invalid previous reply in
    summary mode; with `retry_context="turn"`, `earlier_errors` are the invalid replies of this turn before it,
    oldest first, each shown on a line of its own.
    """
    messages = [{"role": "system", "content": system_prompt(cfg)}]
    if cfg.context == "summary" or not turns:
        text = describe_state(history, max_guesses, cfg.style)
        if last_error is not None:
            text = f"{error_message(*last_error, cfg.rejected_word)} Try again.\n{text}"
            if cfg.retry_context == "turn":
                text = "".join(f"{error_message(*e, cfg.rejected_word)}\n" for e in earlier_errors) + text
        messages.append({"role": "user", "content": text})
        return messages
    played = sum(1 for t in turns if t.pattern is not None)
    seeded = list(history[: len(history) - played])
    messages.append({"role": "user", "content": describe_state(seeded, max_guesses, cfg.style)})
    board = list(seeded)
    for turn in turns:
        messages.append({"role": "assistant", "content": turn.reply})
        if turn.pattern is not None:
            board.append((turn.guess, turn.pattern))
            text = describe_state(board, max_guesses, cfg.style)
        else:
            text = f"{error_message(turn.error, turn.guess, cfg.rejected_word)} Try again.\n{describe_state(board, max_guesses, cfg.style)}"
        messages.append({"role": "user", "content": text})
    return messages


def format_reply(think: str | None, guess: str, guess_format: GuessFormat = "letters") -> str:
    """The canonical reply text (used for SFT targets): `<guess>crane</guess>`, or with
    `guess_format="letters"` `<guess> c r a n e</guess>`, after the think block when there is one."""
    prefix = f"<think>{think}</think>\n" if think is not None else ""
    if guess_format == "letters":
        return f"{prefix}<guess> {' '.join(guess)}</guess>"
    return f"{prefix}<guess>{guess}</guess>"


@dataclass
class ParsedReply:
    guess: str | None            # lower-case 5-letter guess when the reply is well-formed
    error: str | None            # one of REPLY_ERRORS, or None
    think: str | None = None

    @property
    def format_error(self) -> bool:
        return self.error in FORMAT_ERRORS


_GUESS_RE = re.compile(r"<guess>(.*?)</guess>", re.DOTALL | re.IGNORECASE)
_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)
_WORD_RE = re.compile(r"^[a-z]{5}$")
_LETTERS_RE = re.compile(r"^[a-z](?: [a-z]){4}$")     # "c r a n e": the letters format


def parse_reply(text: str, require_think: bool, allowed: Collection[str] | None = None) -> ParsedReply:
    """Classify a model reply. Never raises; the same text always gives the same result."""
    if not isinstance(text, str):
        return ParsedReply(None, MISSING_GUESS)
    guesses = _GUESS_RE.findall(text)
    opens = len(re.findall(r"<guess>", text, re.IGNORECASE))
    if not guesses:
        return ParsedReply(None, MISSING_GUESS)
    if len(guesses) > 1 or opens > 1:
        return ParsedReply(None, MULTIPLE_GUESSES)
    guess_at = _GUESS_RE.search(text).start()
    think_match = _THINK_RE.search(text)
    think = think_match.group(1).strip() if think_match else None
    if require_think and (think_match is None or think_match.end() > guess_at):
        return ParsedReply(None, MISSING_THINK, think)
    word = guesses[0].strip().lower()
    if _LETTERS_RE.match(word):
        word = word.replace(" ", "")
    if not _WORD_RE.match(word):
        return ParsedReply(word[:40] or None, NOT_FIVE_LETTERS, think)
    if allowed is not None and word not in allowed:
        return ParsedReply(word, NOT_A_WORD, think)
    return ParsedReply(word, None, think)
