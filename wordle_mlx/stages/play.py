"""`wordle-mlx play`: watch a model play one game, or play yourself with model and solver hints.

Model mode plays one game with the rollout engine and shows, turn by turn, the model's reply (its
reasoning) and the coloured tiles of its guess, or what was wrong with the reply. `--human` mode lets a
person play in the terminal: each turn asks for a word; `?` shows the model's suggestion (one greedy
reply for the current board, the model is loaded on first use) and the solver's; a word that is not
5 letters or not in the word list is rejected with the reason and does not cost a turn; `quit` or end of
input gives up. The secret is `--secret`, or a word of the test split picked with `--seed`. Input and
output go through `input_fn` / `print_fn`, so tests can drive a whole game.
"""

from __future__ import annotations

import random
from typing import Callable

from pydantic import Field
from rich.markup import escape

from ..config import StrictModel
from ..errors import UserError
from ..game.solver import Solver
from ..game.splits import split_words
from ..game.state import GameState, check_guess
from ..game.tiles import tiles
from ..game.words import answers, guess_list
from ..llm.model.models import load_model
from ..llm.play.prompts import error_message, parse_reply
from ..llm.play.rollout import GameSpec, RolloutConfig, play_games, prompt_token_ids, sample_replies
from ..runtime.progress import console
from .pattern_table import load_table


class PlayConfig(StrictModel):
    model: str = "builtin:gemma-3-270m"
    adapter: str | None = None
    dtype: str | None = None
    secret: str | None = None
    seed: int = Field(0, ge=0, lt=2 ** 32)
    human: bool = False
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)


def pick_secret(cfg: PlayConfig) -> str:
    if cfg.secret is None:
        return random.Random(cfg.seed).choice(split_words("test"))
    word = cfg.secret.strip().lower()
    problem = check_guess(word, answers(), "answer list")
    if problem:
        raise UserError(f"--secret: {problem}")
    return word


def watch_model(cfg: PlayConfig, secret: str, allowed: frozenset, print_fn: Callable) -> dict:
    model, tokenizer = load_model(cfg.model, adapter_path=cfg.adapter, dtype=cfg.dtype)
    print_fn(f"[bold]{escape(cfg.model)}[/] plays; the secret is [bold]{secret.upper()}[/]")

    def on_turn(_index, episode, turn):
        print_fn(f"[dim]turn {len(episode.turns)} reply ({len(turn.completion_tokens)} tokens, "
                 f"{turn.finish_reason}):[/]\n{escape(turn.text.strip())}")
        if turn.error is None:
            note = " (repeated)" if turn.repeated else ("" if turn.consistent else " (ignores earlier feedback)")
            print_fn(f"{len(episode.state.guesses)}. {tiles(turn.guess, turn.pattern)}{note}")
        else:
            print_fn(f"[red]invalid reply:[/] {escape(error_message(turn.error, turn.guess))}")

    rollout = cfg.rollout.model_copy(update={"seed": cfg.seed})
    episode = play_games(model, tokenizer, [GameSpec(secret)], rollout, allowed, on_turn=on_turn)[0]
    verdict = f"won in {len(episode.state.guesses)}" if episode.won else "lost"
    print_fn(f"[bold]{verdict}[/] ({episode.invalid_replies} invalid replies, "
             f"{episode.completion_tokens} tokens)")
    return {"secret": secret, "won": episode.won, "guesses": list(episode.state.guesses),
            "invalid_replies": episode.invalid_replies}


class Hints:
    """Model and solver suggestions for a board (the model is loaded the first time it is asked)."""

    def __init__(self, cfg: PlayConfig, solver: Solver, allowed: frozenset):
        self.cfg, self.solver, self.allowed = cfg, solver, allowed
        self._loaded = None

    def model_suggestion(self, state: GameState) -> str:
        if self._loaded is None:
            self._loaded = load_model(self.cfg.model, adapter_path=self.cfg.adapter, dtype=self.cfg.dtype)
        model, tokenizer = self._loaded
        greedy = self.cfg.rollout.model_copy(update={"temperature": 0.0})
        reply = sample_replies(model, tokenizer, [prompt_token_ids(tokenizer, greedy, state)], 1, greedy,
                               words=self.allowed, boards=[list(state.guesses)])[0][0]
        parsed = parse_reply(reply.text, greedy.prompt.require_think, self.allowed)
        return parsed.guess.upper() if parsed.error is None else f"(no valid guess: {error_message(parsed.error, parsed.guess)})"

    def solver_suggestion(self, state: GameState) -> str:
        return self.solver.next_guess(state.history()).upper()


def play_human(secret: str, hints: Hints, allowed: frozenset, input_fn: Callable[[str], str],
               print_fn: Callable) -> dict:
    state = GameState(secret)
    print_fn("Guess the 5-letter word in 6 tries. Type [bold]?[/] for hints, [bold]quit[/] to give up.")
    while not state.over:
        try:
            raw = input_fn(f"guess {state.turn + 1}/{state.max_guesses}: ")
        except EOFError:
            raw = "quit"
        word = raw.strip().lower()
        if word == "?":
            print_fn(f"model suggests: {escape(hints.model_suggestion(state))}")
            print_fn(f"solver suggests: {hints.solver_suggestion(state)}")
            continue
        if word in ("quit", "exit"):
            break
        problem = check_guess(word, allowed)
        if problem:
            print_fn(f"[red]not played:[/] {escape(problem)}")
            continue
        pattern = state.play(word)
        print_fn(f"{state.turn}. {tiles(word, pattern)}")
    print_fn(f"[bold]{'you won in ' + str(state.turn) if state.won else 'the word was ' + secret.upper()}[/]")
    return {"secret": secret, "won": state.won, "guesses": list(state.guesses)}


def run(cfg: PlayConfig, input_fn: Callable[[str], str] = input, print_fn: Callable | None = None) -> dict:
    print_fn = print_fn or console.print
    if cfg.adapter:    # the prompts and decoding the adapter was trained for, unless rollout sets them
        cfg = cfg.model_copy(update={"rollout": cfg.rollout.for_adapter(cfg.adapter)})
    allowed = frozenset(guess_list())
    secret = pick_secret(cfg)
    if not cfg.human:
        return watch_model(cfg, secret, allowed, print_fn)
    solver = Solver(load_table(show_progress=True))
    return play_human(secret, Hints(cfg, solver, allowed), allowed, input_fn, print_fn)
