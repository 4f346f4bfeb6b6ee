"""One GRPO step, in two halves: play and score (rollout), then the policy gradient of the scored replies.

Rollout (`rollout`): one game per prompt (a secret and a seeded board). At each turn G replies are sampled from
the same board (`rollout.sample_replies_and_greedy`, every game's G samples and its greedy reply in one batch),
each scored with the per-reply reward (`Rewards.turn_mode_values`); the group is the (prompt, turn), which the
greedy reply joins as member G + 1, and the game goes on with the greedy reply, so the boards, error messages
included, are the ones greedy evaluation reaches and the update pushes the reply greedy play gives up or down.
The result is a list of `ScoredItem`s: the reply's token sequence, its group, its reward and its component
values. `policy_gradient` computes group advantages ((r - mean) / std), drops zero-variance groups, splits the
rest into micro-batches (the replies to one board together, the board's prompt run once; others of at most
`max_tokens` padded tokens), and sums the gradients of `grpo_loss` with token-mean weights over the whole step
(every rank's tokens). `policy_update` applies it with the trainer's clip and finiteness check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Collection, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map

from ...game.rewards import ReplyKind, Rewards, TurnFacts
from ..model.logits import has_split_head
from ..play.episode import Episode, TokenSequence, Turn, reply_sequence
from ..play.prompts import FORMAT_ERRORS, NOT_A_WORD, parse_reply
from ..play.rollout import (Completion, GameSpec, RolloutConfig, apply_reply, prompt_token_ids,
                            sample_replies_and_greedy, start_game)
from .advantages import group_advantages
from .distributed import World
from .grpo_loss import (LossSettings, batch_arrays, grpo_loss, pack_batch, pack_shared_batch,
                        reference_logprobs, merge_prompt_groups, shared_prompt_groups, split_batch)
from .trainer import apply_update


@dataclass
class Player:
    """The policy that plays a rollout: the model, its tokenizer and the function that decodes a batch."""
    model: object
    tokenizer: object
    generate_fn: object = None


@dataclass
class ScoredItem:
    """Reply sequences that share one reward (one reply), the group it is compared within, its values."""
    sequences: list[TokenSequence]
    group: int
    reward: float
    values: dict[str, float]


@dataclass
class RolloutResult:
    items: list[ScoredItem]
    episodes: list[Episode]            # the B games that were played
    replies: list[Turn] = field(default_factory=list)   # every sampled reply, with its error kind
    tokens_generated: int = 0
    seconds: float = 0.0


def reply_kind(error: str | None) -> ReplyKind:
    if error is None:
        return ReplyKind.VALID
    if error == NOT_A_WORD:
        return ReplyKind.NOT_A_WORD
    if error in FORMAT_ERRORS:
        return ReplyKind.FORMAT_ERROR
    raise ValueError(f"unknown reply error kind {error!r}")


def rollout(player: Player, prompts: Sequence[GameSpec], cfg: RolloutConfig, allowed: Collection[str],
            rewards: Rewards, num_generations: int) -> RolloutResult:
    """Play one game per prompt, sampling `num_generations` replies to each of its boards (see the docstring)."""
    start = time.perf_counter()
    model, tokenizer, generate_fn = player.model, player.tokenizer, player.generate_fn
    allowed = allowed if isinstance(allowed, (set, frozenset)) else frozenset(allowed)
    games = [start_game(GameSpec(p.secret, list(p.seeded_guesses), group=i), cfg) for i, p in enumerate(prompts)]
    items: list[ScoredItem] = []
    replies: list[Turn] = []
    group_id = 0

    def score(state, prompt, c: Completion):
        parsed = parse_reply(c.text, cfg.prompt.require_think, allowed)
        kind = reply_kind(parsed.error)
        facts = TurnFacts(state.secret, tuple(state.history()), kind,
                          parsed.guess if kind is ReplyKind.VALID else None, len(c.tokens), cfg.max_tokens_per_turn)
        values = rewards.turn_mode_values(facts)
        seq = reply_sequence(prompt, c.tokens, c.logprobs, c.choice, excluded=state.guesses)
        return ScoredItem([seq], group_id, rewards.total(values), values), parsed

    while active := [g for g in games if not g.done]:
        prompt_ids = [prompt_token_ids(tokenizer, cfg, g.episode.state, g.texts, g.turn_errors) for g in active]
        boards = [list(g.episode.state.guesses) for g in active]
        samples, greedy = sample_replies_and_greedy(model, tokenizer, prompt_ids, num_generations, cfg, generate_fn,
                                                    greedy_logprobs_at_temperature=True, words=allowed, boards=boards)
        for game, prompt, completions, greedy_reply in zip(active, prompt_ids, samples, greedy):
            state = game.episode.state
            for c in completions:
                item, parsed = score(state, prompt, c)
                items.append(item)
                replies.append(Turn(list(prompt), list(c.tokens), list(c.logprobs), c.text, parsed.guess,
                                    parsed.error, finish_reason=c.finish_reason, choice=c.choice))
            items.append(score(state, prompt, greedy_reply)[0])     # the greedy reply joins its group
            group_id += 1
            apply_reply(game, prompt, greedy_reply, cfg, allowed)
    tokens = sum(len(t.completion_tokens) for t in replies)
    return RolloutResult(items, [g.episode for g in games], replies, tokens, time.perf_counter() - start)


@dataclass
class UpdateSettings:
    loss: LossSettings
    max_grad_norm: float = 1.0           # 0 = no clipping
    max_tokens: int = 4096               # padded tokens per micro-batch
    max_loss_tokens: int = 256           # model tokens per micro-batch (each one a logit row)
    share_prompts: bool = True           # replies to one prompt: run the prompt once (pack_shared_batch)


@dataclass
class PolicyGradient:
    grads: dict | None                   # summed over every rank; None when no group carried a gradient
    loss: float
    kl: float
    skipped_groups: int
    groups: int                          # all the step's groups (every rank's), live or skipped
    trained_tokens: int


@dataclass
class UpdateResult:
    loss: float
    grad_norm: float
    kl: float
    skipped_groups: int
    applied: bool                        # False when nothing was trainable or the loss/gradient was not finite
    finite: bool
    trained_tokens: int
    seconds: float
    groups: int = 0


def live_sequences(items: Sequence[ScoredItem]) -> tuple[list[TokenSequence], list[float], int]:
    """(the sequences of groups whose rewards differ, their advantages, the number of groups skipped)."""
    advantages, skipped = group_advantages([it.reward for it in items], [it.group for it in items])
    live_groups = {it.group for it, a in zip(items, advantages) if a != 0.0}
    seqs, advs = [], []
    for it, a in zip(items, advantages):
        if it.group in live_groups:
            for seq in it.sequences:
                if sum(seq.mask) > 0:
                    seqs.append(seq)
                    advs.append(float(a))
    return seqs, advs, skipped


def policy_gradient(model, items: Sequence[ScoredItem], s: UpdateSettings, world: World | None = None
                    ) -> PolicyGradient:
    """The gradient of the GRPO loss over `items`. With a `World` of several ranks, `items` are this rank's share:
    the token-mean weights use the global token count and the gradient and loss are all-reduced, so every rank
    gets the gradient a single process would compute on all the items."""
    world = world or World()
    seqs, advs, skipped = live_sequences(items)
    lengths = [sum(q.mask) for q in seqs]
    total_tokens, total_seqs, skipped, groups = world.sum_floats(
        [sum(lengths), len(seqs), skipped, len({it.group for it in items})])
    if total_seqs == 0:
        return PolicyGradient(None, 0.0, 0.0, int(skipped), int(groups), 0)
    weights = [np.full(n, 1.0 / total_tokens) for n in lengths]     # every token of the step counts the same
    model.train()
    value_and_grad = nn.value_and_grad(model, lambda arrays, ref: grpo_loss(model, arrays, s.loss, ref))
    grads, total_loss, kl = None, 0.0, 0.0
    sharing = s.share_prompts and has_split_head(model)
    shared, rest = shared_prompt_groups(seqs, s.max_loss_tokens) if sharing else ([], list(range(len(seqs))))
    shared = merge_prompt_groups(shared, seqs, s.max_tokens, s.max_loss_tokens)
    plain = [[rest[j] for j in idx] for idx in split_batch([seqs[i] for i in rest], s.max_tokens, s.max_loss_tokens)] \
        if rest else []
    for idx, pack in [(g, pack_shared_batch) for g in shared] + [(g, pack_batch) for g in plain]:
        batch = pack([seqs[i] for i in idx], [advs[i] for i in idx], [weights[i] for i in idx])
        arrays = batch_arrays(batch, letters=s.loss.letters)
        ref = reference_logprobs(model, arrays, s.loss.temperature) if s.loss.beta > 0 else None
        (loss, stats), g = value_and_grad(arrays, ref)
        grads = g if grads is None else tree_map(lambda a, b: a + b, grads, g)
        mx.eval(grads, loss, stats)
        total_loss += loss.item()
        kl += stats["kl"].item()
    if grads is None:                    # nothing trainable on this rank; the others still need its zeros
        grads = tree_map(mx.zeros_like, model.trainable_parameters())
    grads = world.sum_tree(grads)
    total_loss, kl = world.sum_floats([total_loss, kl])
    return PolicyGradient(grads, total_loss, kl, int(skipped), int(groups), int(total_tokens))


def policy_update(model, optimizer, items: Sequence[ScoredItem], s: UpdateSettings, world: World | None = None
                  ) -> UpdateResult:
    """One update from `items`: `policy_gradient`, then the trainer's `apply_update` (clip, finiteness check)."""
    start = time.perf_counter()
    g = policy_gradient(model, items, s, world)
    grad_norm, applied, finite = 0.0, False, True
    if g.grads is not None:
        grad_norm, applied = apply_update(model, optimizer, g.grads, s.max_grad_norm, g.loss)
        finite = applied
    model.eval()
    return UpdateResult(g.loss, grad_norm, g.kl, g.skipped_groups, applied, finite, g.trained_tokens,
                        time.perf_counter() - start, g.groups)
