"""The multi-turn rollout engine: N Wordle games played by a model in lockstep, one batch per turn.

`play_games(model, tokenizer, games, cfg, allowed_words)` starts every game from its seeded board
(`GameSpec.seeded_guesses`, possibly empty). Each turn, the prompt of every unfinished game (the
tokenizer's chat template over `prompts.build_messages`, generation prompt added) is sent in ONE call
to the generation backend (`generation.BatchedGenerator` in the config's `decode` mode: one mlx-lm
`BatchGenerator` run in free decoding, the lockstep letter decoder in grammar and words decoding; see
generation.py for stopping rules, KV-prefix reuse and the log-prob convention `policy_logprob_temperature`).
Each reply is parsed (`prompts.parse_reply`) and recorded as an `episode.Turn`. A well-formed allowed
word is played (repeats are played and flagged `repeated`); any other reply is invalid: it is counted,
the next prompt says what was wrong, and it does not use up a guess. A game ends on a win, when no guesses are left, or
after `max_invalid_replies` invalid replies. `sample_replies` samples G completions for each of several
prompts in one batch (a GRPO group); `sample_replies_and_greedy` adds each prompt's greedy reply to
that batch. In words decoding the MLX backend is told each board's words (`call_backend`), so a played word is
never offered again. The backend is a parameter (`generate_fn`), so tests can script replies. Rollouts never build
a gradient graph (nothing here calls value_and_grad) and the model is put in eval mode. With temperature 0
the same inputs give the same games.
"""

from __future__ import annotations

import mlx.core as mx

import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Sequence

from pydantic import Field, model_validator

from ...game.knowledge import is_consistent
from ...game.state import MAX_GUESSES, GameState
from .episode import Episode, Turn
from .generation import (BatchedGenerator, Completion, GenerateFn, SamplingConfig, policy_logprob_temperature,
                         policy_logprobs)
from .prompts import PromptConfig, TurnText, build_messages, choose_prompt, parse_reply
from .reply_grammar import DECODE_HELP, DecodeMode, adapter_decoding, effective_mode

__all__ = ["RolloutConfig", "GameSpec", "play_games", "sample_replies", "sample_replies_and_greedy",
           "prompt_token_ids", "policy_logprob_temperature", "policy_logprobs", "Completion"]


class RolloutConfig(SamplingConfig):
    max_invalid_replies: int = Field(3, ge=1, description="A game ends after this many invalid replies.")
    max_guesses: int = Field(MAX_GUESSES, ge=1, le=MAX_GUESSES, description="Guesses per game.")
    max_turns: int | None = Field(None, ge=1, description="Stop each game after this many model turns (None: to the end).")
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    decode: DecodeMode = Field("grammar", description=DECODE_HELP)

    @model_validator(mode="after")
    def _reply_budget(self) -> "RolloutConfig":
        if "max_tokens_per_turn" not in self.model_fields_set:     # not set: what the reply format needs
            self.__dict__["max_tokens_per_turn"] = reply_token_budget(self.prompt)
        return self

    def for_adapter(self, adapter) -> "RolloutConfig":
        """This config with the prompts `adapter` was trained on, unless `prompt` was set explicitly, the reply
        length they need unless `max_tokens_per_turn` was set, and the decoding the adapter records it was trained
        for unless `decode` was set (an adapter without that record keeps the default, grammar)."""
        prompt = choose_prompt(self.prompt, "prompt" in self.model_fields_set, adapter)
        update = {"prompt": prompt}
        recorded, _ = adapter_decoding(adapter)
        if recorded is not None and "decode" not in self.model_fields_set:
            update["decode"] = recorded
        if "max_tokens_per_turn" not in self.model_fields_set:
            update["max_tokens_per_turn"] = reply_token_budget(prompt)
        return self.model_copy(update=update)


def reply_token_budget(prompt: PromptConfig) -> int:
    """Tokens a reply of this format needs: 16 without a think block (a letters reply is 11 tokens,
    '<guess> c r a n e</guess>'), 256 with one."""
    return 256 if prompt.require_think else 16


@dataclass
class GameSpec:
    secret: str
    seeded_guesses: list[str] = field(default_factory=list)
    group: int = 0


@dataclass
class LiveGame:
    """A game in progress: its episode plus what the next prompt needs."""
    episode: Episode
    texts: list[TurnText] = field(default_factory=list)
    turn_errors: list[tuple[str, str | None]] = field(default_factory=list)   # (kind, guess) since the last played guess
    done: bool = False


def prompt_token_ids(tokenizer, cfg: RolloutConfig, state: GameState, texts: Sequence[TurnText] = (),
                     turn_errors: Sequence[tuple[str, str | None]] = ()) -> list[int]:
    """Token ids of the next prompt for this board (chat template, generation prompt added); `turn_errors` are
    the invalid replies (kind, guess) since the last played guess, oldest first."""
    ids = tokenizer.apply_chat_template(prompt_messages(cfg, state, texts, turn_errors), add_generation_prompt=True)
    return [int(t) for t in (ids if isinstance(ids, list) else ids.tolist())]


def prompt_messages(cfg: RolloutConfig, state: GameState, texts: Sequence[TurnText] = (),
                    turn_errors: Sequence[tuple[str, str | None]] = ()) -> list[dict]:
    """The chat messages of the next prompt for this board (`prompt_token_ids` before the chat template)."""
    return build_messages(cfg.prompt, state.history(), texts, max_guesses=state.max_guesses,
                          last_error=turn_errors[-1] if turn_errors else None, earlier_errors=turn_errors[:-1])


def decode_mode(cfg: SamplingConfig) -> str:
    """The decoding mode a rollout config plays with: its `decode`, or free for a format with free text."""
    if not isinstance(cfg, RolloutConfig):
        return "free"
    return effective_mode(cfg.decode, cfg.prompt, "decode" in cfg.model_fields_set)


def default_generate_fn(model, tokenizer, generate_fn: GenerateFn | None, cfg: SamplingConfig,
                        words: Collection[str] | None = None) -> GenerateFn:
    """The backend to use: `generate_fn` if given, else mlx-lm batching (RNG seeded with cfg.seed) in the
    config's decoding mode (`words` are the allowed guesses words decoding spells)."""
    if generate_fn is not None:
        return generate_fn
    mx.random.seed(cfg.seed)
    return BatchedGenerator(model, tokenizer, mode=decode_mode(cfg), words=words)


def call_backend(generate: GenerateFn, prompts: Sequence[Sequence[int]], cfg: SamplingConfig,
                 boards: Sequence[Collection[str]] | None, **options) -> list[Completion]:
    """`generate(prompts, cfg, **options)`; a backend with `takes_boards` true (the MLX one, the llama.cpp check's)
    also gets `boards` (each prompt's words on the board, which words decoding never spells again). Other backends
    (scripted ones) take prompts and cfg only."""
    if getattr(generate, "takes_boards", False):
        return generate(prompts, cfg, excluded=boards, **options)
    return generate(prompts, cfg, **options)


def sample_replies(model, tokenizer, prompts_token_ids: Sequence[Sequence[int]], num_generations: int,
                   cfg: SamplingConfig, generate_fn: GenerateFn | None = None,
                   words: Collection[str] | None = None,
                   boards: Sequence[Collection[str]] | None = None) -> list[list[Completion]]:
    """`num_generations` completions for each prompt, all sampled in one batch: result[i][j] is sample j of prompt i
    (`words`: the allowed guesses, for words decoding; `boards`: each prompt's words on the board)."""
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    generate = default_generate_fn(model, tokenizer, generate_fn, cfg, words)
    flat = [list(p) for p in prompts_token_ids for _ in range(num_generations)]
    out = call_backend(generate, flat, cfg, repeat(boards, num_generations))
    return [out[i * num_generations:(i + 1) * num_generations] for i in range(len(prompts_token_ids))]


def sample_replies_and_greedy(model, tokenizer, prompts_token_ids: Sequence[Sequence[int]], num_generations: int,
                              cfg: SamplingConfig, generate_fn: GenerateFn | None = None,
                              greedy_logprobs_at_temperature: bool = False, words: Collection[str] | None = None,
                              boards: Sequence[Collection[str]] | None = None
                              ) -> tuple[list[list[Completion]], list[Completion]]:
    """`sample_replies` plus each prompt's greedy reply. With the MLX backend both come from one batch (the
    greedy row shares its prompt's prefill with the G samples); another backend is called twice. The greedy
    reply's log-probs are at T = 1, or with `greedy_logprobs_at_temperature` at the sampling temperature (so
    it can be trained on beside the samples; another backend can do that only when T is 1)."""
    generate = default_generate_fn(model, tokenizer, generate_fn, cfg, words)
    if not isinstance(generate, BatchedGenerator):
        if greedy_logprobs_at_temperature and policy_logprob_temperature(cfg) != 1.0:
            raise ValueError("greedy log-probs at the sampling temperature need the MLX backend when T != 1")
        greedy_cfg = cfg.model_copy(update={"temperature": 0.0})
        return (sample_replies(model, tokenizer, prompts_token_ids, num_generations, cfg, generate),
                [r[0] for r in sample_replies(model, tokenizer, prompts_token_ids, 1, greedy_cfg, generate)])
    flat = [list(p) for p in prompts_token_ids for _ in range(num_generations + 1)]
    flags = ([False] * num_generations + [True]) * len(prompts_token_ids)
    out = call_backend(generate, flat, cfg, repeat(boards, num_generations + 1), greedy=flags,
                       greedy_logprobs_at_temperature=greedy_logprobs_at_temperature)
    step = num_generations + 1
    return ([out[i * step:i * step + num_generations] for i in range(len(prompts_token_ids))],
            [out[i * step + num_generations] for i in range(len(prompts_token_ids))])


def repeat(boards: Sequence[Collection[str]] | None, n: int) -> list[Collection[str]] | None:
    """Each prompt's board `n` times, as the prompts are repeated for their samples."""
    return None if boards is None else [b for b in boards for _ in range(n)]


def start_game(spec: GameSpec, cfg: RolloutConfig) -> LiveGame:
    state = GameState(secret=spec.secret, max_guesses=cfg.max_guesses)
    for guess in spec.seeded_guesses:
        state.play(guess)
    if state.over:
        raise ValueError(f"seeded guesses {spec.seeded_guesses} already end the game for {spec.secret!r}")
    return LiveGame(Episode(secret=spec.secret, seeded=list(spec.seeded_guesses), state=state, group=spec.group))


def apply_reply(game: LiveGame, prompt: list[int], reply: Completion, cfg: RolloutConfig, allowed: Collection[str]) -> None:
    """Record one reply as a Turn, play it if valid, and decide whether the game is over."""
    ep, state = game.episode, game.episode.state
    parsed = parse_reply(reply.text, cfg.prompt.require_think, allowed)
    turn = Turn(prompt_tokens=list(prompt), completion_tokens=list(reply.tokens), logprobs=list(reply.logprobs),
                text=reply.text, guess=parsed.guess, error=parsed.error, finish_reason=reply.finish_reason,
                choice=reply.choice)
    if parsed.error is None:
        history = state.history()
        turn.repeated = parsed.guess in state.guesses
        turn.consistent = is_consistent(parsed.guess, history)
        turn.pattern = state.play(parsed.guess)
        game.turn_errors = []
    else:
        ep.invalid_replies += 1
        game.turn_errors.append((parsed.error, parsed.guess))
    ep.turns.append(turn)
    game.texts.append(TurnText(reply=reply.text, guess=parsed.guess, pattern=turn.pattern, error=parsed.error))
    game.done = (state.won or len(state.guesses) >= state.max_guesses or ep.invalid_replies >= cfg.max_invalid_replies
                 or (cfg.max_turns is not None and len(ep.turns) >= cfg.max_turns))


def play_games(model, tokenizer, games: Sequence[GameSpec], cfg: RolloutConfig, allowed_words: Collection[str],
               progress: Callable[..., None] | None = None, generate_fn: GenerateFn | None = None,
               deadline: float | None = None,
               on_turn: Callable[[int, Episode, Turn], None] | None = None) -> list[Episode]:
    """Play every game to the end, batching all unfinished games' turns; episodes come back in input order.

    `allowed_words` decides which well-formed guesses are playable (a set is fastest). `progress(n, info=...)`
    is called with the number of games that just finished. `deadline` (a time.monotonic() value) stops
    before a turn that would start after it; the unfinished episodes are marked `timed_out`.
    `on_turn(game_index, episode, turn)` is called after every recorded turn (live display).
    """
    allowed = allowed_words if isinstance(allowed_words, (set, frozenset)) else frozenset(allowed_words)
    generate = default_generate_fn(model, tokenizer, generate_fn, cfg, allowed)
    if model is not None and hasattr(model, "eval"):
        model.eval()
    running = [start_game(spec, cfg) for spec in games]
    _play(running, tokenizer, generate, cfg, allowed, progress, deadline, on_turn)
    return [g.episode for g in running]


def _play(running: list[LiveGame], tokenizer, generate: GenerateFn, cfg: RolloutConfig, allowed: frozenset,
          progress: Callable[..., None] | None = None, deadline: float | None = None,
          on_turn: Callable[[int, Episode, Turn], None] | None = None) -> None:
    """The lockstep loop: every unfinished game's next prompt in one `generate` call, until all are done."""
    turn_no = 0
    while True:
        active = [g for g in running if not g.done]
        active_index = [i for i, g in enumerate(running) if not g.done]
        if not active:
            break
        if deadline is not None and time.monotonic() > deadline:
            for g in active:
                g.episode.timed_out = True
            break
        turn_no += 1
        prompts = [prompt_token_ids(tokenizer, cfg, g.episode.state, g.texts, g.turn_errors) for g in active]
        replies = call_backend(generate, prompts, cfg, [list(g.episode.state.guesses) for g in active])
        if len(replies) != len(prompts):
            raise RuntimeError(f"generation backend returned {len(replies)} replies for {len(prompts)} prompts")
        for i, game, prompt, reply in zip(active_index, active, prompts, replies):
            apply_reply(game, prompt, reply, cfg, allowed)
            if on_turn is not None:
                on_turn(i, game.episode, game.episode.turns[-1])
        finished = sum(1 for g in active if g.done)
        if progress is not None:
            progress(finished, info=f"turn {turn_no}")
