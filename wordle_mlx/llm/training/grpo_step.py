"""One GRPO step, in two halves: play and score (rollout), then one policy-gradient update.

Rollout, `episode` mode: each of B prompts (secret + seeded board) is played G times to the end, all
B x G games in one lockstep batch (`rollout.play_games`); a game's reward is `Rewards.game_values`
(win, early, mean of the per-turn components) and every model token of the game gets the game's group
advantage. Rollout, `turn` mode: one trajectory per prompt; at each turn G replies are sampled from the
same state (`rollout.sample_replies`, all B x G in one batch), each scored with the per-turn reward
(`Rewards.turn_mode_values`), the group is the (prompt, turn), and the game advances with the
best-scoring valid reply (the best reply of any kind if none is valid), or with `continue_with="sampled"`
with the first of the G replies: they are independent draws, so that is one on-policy sample and the
later boards are the ones the sampling policy itself reaches; or with `continue_with="greedy"` with the
policy's own temperature-0 reply (a greedy row in the same batch), so the boards, error messages
included, are the ones greedy evaluation reaches; with `train_greedy` that reply also joins its group as
member G + 1 and is trained on, so the update pushes the greedy reply itself up or down. The result is a
list of `ScoredItem`s: the reply sequences that share one reward, the group it is compared within, and its
component values. `policy_update` computes group advantages, drops zero-variance groups, splits the rest
into micro-batches (replies that share a prompt together, the prompt run once; the others of at most
`max_tokens` padded tokens), accumulates gradients of `grpo_loss`, clips them, and applies the optimizer only
when the loss and gradient norm are finite.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Collection, Sequence

import numpy as np

from ...game.rewards import ReplyKind, Rewards, TurnFacts
from ..play.episode import Episode, TokenSequence, Turn, reply_sequence
from .advantages import group_advantages
from .grpo_loss import (LossSettings, batch_arrays, grpo_loss, pack_batch, pack_shared_batch, reference_logprobs,
                        shared_prompt_groups, split_batch)
from ..play.prompts import FORMAT_ERRORS, NOT_A_WORD, ParsedReply, parse_reply
from ..play.rollout import (Completion, GameSpec, RolloutConfig, _apply, _start, play_games, prompt_token_ids,
                      sample_replies, sample_replies_and_greedy)


@dataclass
class Player:
    """The policy that plays a rollout: the model, its tokenizer and the function that decodes a batch."""
    model: object
    tokenizer: object
    generate_fn: object = None


CONTINUE_WITH = ("best", "sampled", "greedy")


@dataclass
class GroupSettings:
    """How a rollout forms its groups: G games (episode) or G replies per turn (turn), and in turn mode which
    reply the game goes on with (`CONTINUE_WITH`) and whether the greedy one joins its group (`train_greedy`)."""
    num_generations: int
    continue_with: str = "best"
    train_greedy: bool = False

    def __post_init__(self):
        if self.continue_with not in CONTINUE_WITH:
            raise ValueError(f"continue_with must be one of {', '.join(CONTINUE_WITH)}, got {self.continue_with!r}")
        if self.train_greedy and self.continue_with != "greedy":
            raise ValueError(f"train_greedy needs continue_with='greedy', got {self.continue_with!r}")


@dataclass
class ScoredItem:
    """Reply sequences that share one reward (a whole game in episode mode, one reply in turn mode)."""
    sequences: list[TokenSequence]
    group: int
    reward: float
    values: dict[str, float]


@dataclass
class RolloutResult:
    items: list[ScoredItem]
    episodes: list[Episode]            # the games that were played (B x G, or B trajectories in turn mode)
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


def turn_facts(ep: Episode, max_tokens: int) -> list[TurnFacts]:
    """The reward view of each of a game's replies, replaying the board from the seeded guesses."""
    board = ep.state.history()[:len(ep.seeded)]
    out = []
    for turn in ep.turns:
        kind = reply_kind(turn.error)
        out.append(TurnFacts(ep.secret, tuple(board), kind, turn.guess if kind is ReplyKind.VALID else None,
                             len(turn.completion_tokens), max_tokens))
        if turn.pattern is not None:
            board.append((turn.guess, turn.pattern))
    return out


def game_specs(prompts: Sequence[GameSpec], copies: int) -> list[GameSpec]:
    """Each prompt `copies` times, group id = the prompt's index."""
    return [GameSpec(p.secret, list(p.seeded_guesses), group=i) for i, p in enumerate(prompts) for _ in range(copies)]


def rollout_episode_mode(player: Player, prompts: Sequence[GameSpec], cfg: RolloutConfig, allowed: Collection[str],
                         rewards: Rewards, group: GroupSettings) -> RolloutResult:
    start = time.perf_counter()
    episodes = play_games(player.model, player.tokenizer, game_specs(prompts, group.num_generations), cfg, allowed,
                          generate_fn=player.generate_fn)
    items = []
    for ep in episodes:
        values = rewards.game_values(turn_facts(ep, cfg.max_tokens_per_turn), ep.won, len(ep.state.guesses))
        items.append(ScoredItem(ep.token_sequences(), ep.group, rewards.total(values), values))
    replies = [t for ep in episodes for t in ep.turns]
    return RolloutResult(items, episodes, replies, sum(len(t.completion_tokens) for t in replies),
                         time.perf_counter() - start)


def rollout_turn_mode(player: Player, prompts: Sequence[GameSpec], cfg: RolloutConfig, allowed: Collection[str],
                      rewards: Rewards, group: GroupSettings) -> RolloutResult:
    start = time.perf_counter()
    model, tokenizer, generate_fn = player.model, player.tokenizer, player.generate_fn
    allowed = allowed if isinstance(allowed, (set, frozenset)) else frozenset(allowed)
    games = [_start(GameSpec(p.secret, list(p.seeded_guesses), group=i), cfg) for i, p in enumerate(prompts)]
    items: list[ScoredItem] = []
    replies: list[Turn] = []
    group_id = 0

    def score(state, prompt, c: Completion) -> tuple[ScoredItem, ParsedReply]:
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
        if group.continue_with == "greedy":      # the greedy reply decoded in the same batch as the G samples
            samples, greedy = sample_replies_and_greedy(model, tokenizer, prompt_ids, group.num_generations, cfg,
                                                        generate_fn, greedy_logprobs_at_temperature=group.train_greedy,
                                                        words=allowed, boards=boards)
        else:
            samples = sample_replies(model, tokenizer, prompt_ids, group.num_generations, cfg, generate_fn=generate_fn,
                                     words=allowed, boards=boards)
            greedy = [None] * len(active)
        for game, prompt, completions, greedy_reply in zip(active, prompt_ids, samples, greedy):
            state = game.episode.state
            scored = []
            for c in completions:
                item, parsed = score(state, prompt, c)
                items.append(item)
                scored.append((parsed.error is None, item.reward, c))
                replies.append(Turn(list(prompt), list(c.tokens), list(c.logprobs), c.text, parsed.guess,
                                    parsed.error, finish_reason=c.finish_reason, choice=c.choice))
            if group.train_greedy:               # the greedy reply joins its group as member G + 1
                items.append(score(state, prompt, greedy_reply)[0])
            group_id += 1
            if group.continue_with == "best":
                chosen = scored[max(range(len(scored)), key=lambda i: (scored[i][0], scored[i][1], -i))][2]
            elif group.continue_with == "sampled":
                chosen = scored[0][2]
            else:
                chosen = greedy_reply
            _apply(game, prompt, chosen, cfg, allowed)
    tokens = sum(len(t.completion_tokens) for t in replies)
    return RolloutResult(items, [g.episode for g in games], replies, tokens, time.perf_counter() - start)


@dataclass
class UpdateSettings:
    loss: LossSettings
    averaging: str = "token"
    advantage: str = "normalized"        # "normalized": (r - mean) / std in a group; "centered": r - mean
    max_grad_norm: float = 1.0           # 0 = no clipping
    max_tokens: int = 4096               # padded tokens per micro-batch
    max_loss_tokens: int = 256           # model tokens per micro-batch (each one is a vocab-sized logit row)
    share_prompts: bool = True           # replies to one prompt: run the prompt once (pack_shared_batch)


@dataclass
class UpdateResult:
    loss: float
    grad_norm: float
    kl: float
    clip_fraction: float
    skipped_groups: int
    applied: bool                        # False when nothing was trainable or the loss/gradient was not finite
    finite: bool
    trained_tokens: int
    seconds: float
    groups: int = 0                      # all the step's groups (every rank's), live or skipped
    ratio_gap: float = 0.0               # max |ratio - 1| over this rank's trained tokens before the update (0)


def shared_weights(lengths: Sequence[int], averaging: str, total_tokens: float, total_sequences: float) -> list:
    """`averaging_weights` normalised over the whole step's sequences, which may live on several ranks."""
    if averaging == "token":
        return [np.full(n, 1.0 / total_tokens) for n in lengths]
    if averaging == "sequence":
        return [np.full(n, 1.0 / (n * total_sequences)) for n in lengths]
    raise ValueError(f"unknown averaging {averaging!r}; use 'token' or 'sequence'")


def policy_update(model, optimizer, items: Sequence[ScoredItem], s: UpdateSettings, world=None) -> UpdateResult:
    """One update from `items`. With a `World` of several ranks, `items` are this rank's share: the averaging
    weights use the global token/sequence counts, gradient sums and loss statistics are all-reduced, and every
    rank applies the same update (the one a single process would make on all the items)."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_map

    from .distributed import World
    from ..model.logits import has_split_head

    world = world or World()
    start = time.perf_counter()
    if s.advantage not in ("normalized", "centered"):
        raise ValueError(f"unknown advantage {s.advantage!r}; use 'normalized' or 'centered'")
    advantages, skipped = group_advantages([it.reward for it in items], [it.group for it in items],
                                           scale=s.advantage == "normalized")
    live_groups = {it.group for it, a in zip(items, advantages) if a != 0.0}
    seqs, advs = [], []
    for it, a in zip(items, advantages):
        if it.group in live_groups:
            for seq in it.sequences:
                if sum(seq.mask) > 0:
                    seqs.append(seq)
                    advs.append(float(a))
    lengths = [sum(q.mask) for q in seqs]
    total_tokens, total_seqs, skipped, groups = world.sum_floats(
        [sum(lengths), len(seqs), skipped, len({it.group for it in items})])
    skipped, groups = int(skipped), int(groups)
    if total_seqs == 0:
        return UpdateResult(0.0, 0.0, 0.0, 0.0, skipped, False, True, 0, time.perf_counter() - start, groups)
    weights = shared_weights(lengths, s.averaging, total_tokens, max(total_seqs, 1.0))
    model.train()

    def loss_of(arrays, ref):
        return grpo_loss(model, arrays, s.loss, ref)

    value_and_grad = nn.value_and_grad(model, loss_of)
    grads, total_loss, kl, clip, ratio_gap = None, 0.0, 0.0, 0.0, 0.0
    sharing = s.share_prompts and has_split_head(model)
    shared, rest = shared_prompt_groups(seqs, s.max_loss_tokens) if sharing else ([], list(range(len(seqs))))
    plain = [[rest[j] for j in idx] for idx in split_batch([seqs[i] for i in rest], s.max_tokens, s.max_loss_tokens)] \
        if rest else []
    for idx, pack in [(g, pack_shared_batch) for g in shared] + [(g, pack_batch) for g in plain]:
        batch = pack([seqs[i] for i in idx], [advs[i] for i in idx], [weights[i] for i in idx])
        arrays = batch_arrays(batch, rollout_logprobs=False, letters=s.loss.letters)   # old: the trainer's own, ratio 1
        ref = reference_logprobs(model, arrays, s.loss.temperature) if s.loss.beta > 0 else None
        (loss, stats), g = value_and_grad(arrays, ref)
        grads = g if grads is None else tree_map(lambda a, b: a + b, grads, g)
        mx.eval(grads, loss, stats)
        total_loss += loss.item()
        kl += stats["kl"].item()
        clip += stats["clip_fraction"].item()
        ratio_gap = max(ratio_gap, stats["ratio_gap"].item())
    if grads is None:                    # nothing trainable on this rank; the others still need its zeros
        grads = tree_map(mx.zeros_like, model.trainable_parameters())
    grads = world.sum_tree(grads)
    total_loss, kl, clip = world.sum_floats([total_loss, kl, clip])
    if s.max_grad_norm > 0:
        grads, norm = optim.clip_grad_norm(grads, s.max_grad_norm)
    else:
        norm = mx.sqrt(sum((g * g).sum() for g in _leaves(grads)))
    grad_norm = float(norm.item())
    finite = bool(np.isfinite(total_loss) and np.isfinite(grad_norm))
    if finite:
        optimizer.update(model, grads)
        mx.eval(model.trainable_parameters(), optimizer.state)
    model.eval()
    return UpdateResult(total_loss, grad_norm, kl, clip, skipped, finite, finite, int(total_tokens),
                        time.perf_counter() - start, groups, ratio_gap)


def _leaves(tree) -> list:
    from mlx.utils import tree_flatten

    return [v for _, v in tree_flatten(tree)]
