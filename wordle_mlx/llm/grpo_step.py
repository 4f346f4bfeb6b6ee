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
member G + 1 and is trained on, so the update pushes the greedy reply itself up or down; with a `guide`
(`guide.GuideReplies`), a tight board's group also gets the fitting answer the model likes best. With
`turn_reward="greedy_return"`, each distinct reply's game is then played on greedily to its end (one lockstep
batch, `rollout.play_on`) and win/early score that game: the reply's exact value under greedy play
("greedy_return_strict": there, a rejected reply uses up a guess and counts as one). The result is a
list of `ScoredItem`s: the reply sequences that share one reward, the group it is compared within, and its
component values. `policy_update` computes group advantages (or, with `advantage="expected"`, those of minimum
risk training: `item_advantages`; with `advantage="prefix"`, per-token ones that leave the tokens a group
shares at 0: `prefix_item_advantages`; with `positive_only`, negative ones set to 0), drops zero-variance groups
(or, with `unplayable_advantage` < 0, gives a dead group that played no word that advantage), splits the rest
into micro-batches (replies that share a prompt together, the prompt run once; the others of at most
`max_tokens` padded tokens), accumulates gradients of `grpo_loss`, clips them, and applies the optimizer only
when the loss and gradient norm are finite.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Collection, Sequence

import numpy as np

from ..game.rewards import ReplyKind, Rewards, TurnFacts
from .episode import Episode, TokenSequence, Turn
from .advantages import expected_reward_advantages, group_advantages, prefix_advantages
from .grpo_loss import (LossSettings, batch_arrays, grpo_loss, pack_batch, pack_shared_batch, reference_logprobs,
                        shared_prompt_groups, split_batch)
from .prompts import FORMAT_ERRORS, NOT_A_WORD, ParsedReply, parse_reply
from .rollout import (Completion, GameSpec, RolloutConfig, _apply, _Game, _start, play_games, play_on,
                      prompt_token_ids, sample_replies, sample_replies_and_greedy)


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


def rollout_episode_mode(model, tokenizer, prompts: Sequence[GameSpec], num_generations: int, cfg: RolloutConfig,
                         allowed: Collection[str], rewards: Rewards, generate_fn) -> RolloutResult:
    start = time.perf_counter()
    episodes = play_games(model, tokenizer, game_specs(prompts, num_generations), cfg, allowed,
                          generate_fn=generate_fn)
    items = []
    for ep in episodes:
        values = rewards.game_values(turn_facts(ep, cfg.max_tokens_per_turn), ep.won, len(ep.state.guesses))
        items.append(ScoredItem(ep.token_sequences(), ep.group, rewards.total(values), values))
    replies = [t for ep in episodes for t in ep.turns]
    return RolloutResult(items, episodes, replies, sum(len(t.completion_tokens) for t in replies),
                         time.perf_counter() - start)


CONTINUE_WITH = ("best", "sampled", "greedy")
TURN_REWARDS = ("immediate", "greedy_return", "greedy_return_strict")


def rollout_turn_mode(model, tokenizer, prompts: Sequence[GameSpec], num_generations: int, cfg: RolloutConfig,
                      allowed: Collection[str], rewards: Rewards, generate_fn,
                      continue_with: str = "best", train_greedy: bool = False,
                      turn_reward: str = "immediate", guide=None) -> RolloutResult:
    if turn_reward not in TURN_REWARDS:
        raise ValueError(f"turn_reward must be one of {', '.join(TURN_REWARDS)}, got {turn_reward!r}")
    if continue_with not in CONTINUE_WITH:
        raise ValueError(f"continue_with must be one of {', '.join(CONTINUE_WITH)}, got {continue_with!r}")
    if train_greedy and continue_with != "greedy":
        raise ValueError(f"train_greedy needs continue_with='greedy', got {continue_with!r}")
    start = time.perf_counter()
    allowed = allowed if isinstance(allowed, (set, frozenset)) else frozenset(allowed)
    games = [_start(GameSpec(p.secret, list(p.seeded_guesses), group=i), cfg) for i, p in enumerate(prompts)]
    items: list[ScoredItem] = []
    replies: list[Turn] = []
    group = 0
    returns, strict = turn_reward != "immediate", turn_reward == "greedy_return_strict"
    # strict: in the played-on game a rejected reply (the scored one included) uses up a guess and counts as one
    branch_cfg = cfg.model_copy(update={"invalid_costs_turn": True}) if strict else cfg
    branches: dict[tuple, tuple[_Game, int]] = {}   # (group, reply tokens) -> (game copy, invalid replies before)
    branch_of: list[tuple[int, tuple]] = []   # (item index, its branch)

    def branch(game: _Game, prompt: list[int], c: Completion) -> None:
        key = (group, tuple(c.tokens))
        if key not in branches:
            branches[key] = (copy.deepcopy(game), game.episode.invalid_replies)
            _apply(branches[key][0], prompt, c, branch_cfg, allowed)
        branch_of.append((len(items) - 1, key))

    def score(state, prompt, c: Completion) -> tuple[ScoredItem, ParsedReply]:
        parsed = parse_reply(c.text, cfg.prompt.require_think, allowed)
        kind = reply_kind(parsed.error)
        facts = TurnFacts(state.secret, tuple(state.history()), kind,
                          parsed.guess if kind is ReplyKind.VALID else None, len(c.tokens), cfg.max_tokens_per_turn)
        values = rewards.turn_mode_values(facts)
        seq = TokenSequence(list(prompt) + list(c.tokens), [0] * len(prompt) + [1] * len(c.tokens),
                            [0.0] * len(prompt) + list(c.logprobs))
        return ScoredItem([seq], group, rewards.total(values), values), parsed

    while active := [g for g in games if not g.done]:
        prompt_ids = [prompt_token_ids(tokenizer, cfg, g.episode.state, g.texts, g.turn_errors) for g in active]
        if continue_with == "greedy":      # the greedy reply decoded in the same batch as the G samples
            samples, greedy = sample_replies_and_greedy(model, tokenizer, prompt_ids, num_generations, cfg, generate_fn,
                                                        greedy_logprobs_at_temperature=train_greedy)
        else:
            samples = sample_replies(model, tokenizer, prompt_ids, num_generations, cfg, generate_fn=generate_fn)
            greedy = [None] * len(active)
        for game, prompt, completions, greedy_reply in zip(active, prompt_ids, samples, greedy):
            state = game.episode.state
            scored = []
            for c in completions:
                item, parsed = score(state, prompt, c)
                items.append(item)
                if returns:
                    branch(game, prompt, c)
                scored.append((parsed.error is None, item.reward, c))
                replies.append(Turn(list(prompt), list(c.tokens), list(c.logprobs), c.text, parsed.guess,
                                    parsed.error, finish_reason=c.finish_reason))
            if train_greedy:               # the greedy reply joins its group as member G + 1
                items.append(score(state, prompt, greedy_reply)[0])
                if returns:
                    branch(game, prompt, greedy_reply)
            if guide is not None and (guided := guide(state, prompt, game.texts, game.turn_errors)) is not None:
                items.append(score(state, prompt, guided)[0])    # off-policy: scored and trained on, never played
                if returns:
                    branch(game, prompt, guided)
            group += 1
            if continue_with == "best":
                chosen = scored[max(range(len(scored)), key=lambda i: (scored[i][0], scored[i][1], -i))][2]
            elif continue_with == "sampled":
                chosen = scored[0][2]
            else:
                chosen = greedy_reply
            _apply(game, prompt, chosen, cfg, allowed)
    tokens = sum(len(t.completion_tokens) for t in replies)
    if returns:                          # every reply's game played on greedily: its value under greedy play
        tokens += play_on(model, tokenizer, [g for g, _ in branches.values() if not g.done],
                          branch_cfg.model_copy(update={"temperature": 0.0}), allowed, generate_fn)
        for i, key in branch_of:
            game, invalid_before = branches[key]
            if not game.done:
                raise RuntimeError(f"the greedy return of a reply for {game.episode.secret!r} was not played out")
            used = len(game.episode.state.guesses) + (game.episode.invalid_replies - invalid_before if strict else 0)
            items[i] = with_game_outcome(items[i], game.episode.state.won, used, rewards)
    return RolloutResult(items, [g.episode for g in games], replies, tokens, time.perf_counter() - start)


def with_game_outcome(item: ScoredItem, won: bool, guesses: int, rewards: Rewards) -> ScoredItem:
    """`item` with win and early scored by how its game ended (won or not, guesses used)."""
    values = dict(item.values)
    values["win"] = 1.0 if won else 0.0
    values["early"] = rewards.early_value(won, guesses)
    return ScoredItem(item.sequences, item.group, rewards.total(values), values)


@dataclass
class UpdateSettings:
    loss: LossSettings
    averaging: str = "token"
    advantage: str = "normalized"        # GRPO: "normalized" or "centered"; "prefix" (per token); "expected" (MRT)
    expected_sharpness: float = 1.0      # "expected": Q(y) is proportional to p(y) ** expected_sharpness
    unplayable_advantage: float = 0.0    # advantage of a group in which no reply played a word (0 = GRPO: skipped)
    max_grad_norm: float = 1.0           # 0 = no clipping
    max_tokens: int = 4096               # padded tokens per micro-batch
    max_loss_tokens: int = 256           # model tokens per micro-batch (each one is a vocab-sized logit row)
    share_prompts: bool = True           # replies to one prompt: run the prompt once (pack_shared_batch)
    reference_weights: object = None     # LoRA weights of the KL reference (beta > 0); None = LoRA switched off
    positive_only: bool = False          # train only on replies with advantage > 0 (self-imitation)


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
    unplayable_groups: int = 0           # zero-variance groups trained with `unplayable_advantage`
    groups: int = 0                      # all the step's groups (every rank's), live or skipped
    ratio_gap: float = 0.0               # max |ratio - 1| over this rank's trained tokens before the update (0)


def shared_weights(lengths: Sequence[int], averaging: str, total_tokens: float, total_sequences: float) -> list:
    """`averaging_weights` normalised over the whole step's sequences, which may live on several ranks."""
    if averaging == "token":
        return [np.full(n, 1.0 / total_tokens) for n in lengths]
    if averaging == "sequence":
        return [np.full(n, 1.0 / (n * total_sequences)) for n in lengths]
    raise ValueError(f"unknown averaging {averaging!r}; use 'token' or 'sequence'")


def policy_update(model, optimizer, items: Sequence[ScoredItem], s: UpdateSettings, world=None,
                  extra_grads=None) -> UpdateResult:
    """One update from `items`. With a `World` of several ranks, `items` are this rank's share: the averaging
    weights use the global token/sequence counts, gradient sums and loss statistics are all-reduced, and every
    rank applies the same update (the one a single process would make on all the items). `extra_grads` (a
    gradient tree already summed over ranks, e.g. the SFT anchor's) is added to the GRPO gradient before
    clipping; with it a step with no live group still updates."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_map

    from .distributed import World
    from .logits import has_split_head

    world = world or World()
    start = time.perf_counter()
    advantages, skipped = item_advantages(items, s.advantage, s.expected_sharpness)
    advantages, unplayable = unplayable_group_advantages(items, advantages, s.unplayable_advantage)
    per_token = prefix_item_advantages(items) if s.advantage == "prefix" else [None] * len(items)
    if s.positive_only:
        advantages = np.maximum(advantages, 0.0)
        per_token = [None if a is None else np.maximum(a, 0.0) for a in per_token]
    skipped -= unplayable
    # with "prefix", a group with any reward spread also has a reply whose (scalar) advantage is not 0
    live_groups = {it.group for it, a in zip(items, advantages) if a != 0.0}
    seqs, advs = [], []
    for it, a, pt in zip(items, advantages, per_token):
        if it.group in live_groups:
            for seq in it.sequences:
                if sum(seq.mask) > 0:
                    seqs.append(seq)
                    advs.append(float(a) if pt is None else pt)
    lengths = [sum(q.mask) for q in seqs]
    total_tokens, total_seqs, skipped, unplayable, groups = world.sum_floats(
        [sum(lengths), len(seqs), skipped, unplayable, len({it.group for it in items})])
    skipped, unplayable, groups = int(skipped), int(unplayable), int(groups)
    if total_seqs == 0 and extra_grads is None:
        return UpdateResult(0.0, 0.0, 0.0, 0.0, skipped, False, True, 0, time.perf_counter() - start, unplayable,
                            groups)
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
        arrays = batch_arrays(batch, rollout_logprobs=False)     # old log-probs: the trainer's own, ratio 1
        ref = reference_logprobs(model, arrays, s.loss.temperature, s.reference_weights) if s.loss.beta > 0 else None
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
    if extra_grads is not None:
        grads = tree_map(lambda a, b: a + b, grads, extra_grads)
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
                        time.perf_counter() - start, unplayable, groups, ratio_gap)


def item_advantages(items: Sequence[ScoredItem], advantage: str, sharpness: float = 1.0) -> tuple[np.ndarray, int]:
    """(advantage per item, zero-variance groups): GRPO's group-relative ones, or with "expected" those of
    minimum risk training, from each item's summed rollout log-prob, its replies' tokens as its identity."""
    rewards, groups = [it.reward for it in items], [it.group for it in items]
    if advantage == "prefix":           # per-reply numbers for the skip count; the tokens' come from below
        return group_advantages(rewards, groups, scale=True)
    if advantage in ("normalized", "centered"):
        return group_advantages(rewards, groups, scale=advantage == "normalized")
    if advantage != "expected":
        raise ValueError(f"unknown advantage {advantage!r}; use 'normalized', 'centered' or 'expected'")
    logprobs = [sum(lp for q in it.sequences for lp, m in zip(q.logprobs, q.mask) if m) for it in items]
    keys = [tuple(t for q in it.sequences for t, m in zip(q.tokens, q.mask) if m) for it in items]
    return expected_reward_advantages(rewards, groups, logprobs, keys, sharpness)


def prefix_item_advantages(items: Sequence[ScoredItem]) -> list[np.ndarray | None]:
    """Per-token advantages of each item's reply (`advantages.prefix_advantages`), None in a zero-variance
    group; every item must be one reply sequence (turn mode)."""
    if any(len(it.sequences) != 1 for it in items):
        raise ValueError("advantage 'prefix' needs one reply sequence per item (rl.mode 'turn')")
    replies = [[t for t, m in zip(it.sequences[0].tokens, it.sequences[0].mask) if m] for it in items]
    return prefix_advantages(replies, [it.reward for it in items], [it.group for it in items])[0]


def unplayable_group_advantages(items: Sequence[ScoredItem], advantages: np.ndarray,
                                value: float) -> tuple[np.ndarray, int]:
    """(advantages, number of groups changed): every item of a zero-variance group in which no reply played a
    word (reward component `valid` 0 throughout: non-words or format errors) gets `value` instead of 0.

    Plain GRPO (`value` 0) learns nothing from such a group, so a board on which every sample is the same
    kind of non-word is never trained on; a negative `value` pushes those replies down (negative-sample
    reinforcement). Groups with any spread, or with a played word, keep their group-relative advantage."""
    if value == 0.0:
        return advantages, 0
    out = np.array(advantages, dtype=np.float64)
    by_group: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        by_group.setdefault(it.group, []).append(i)
    changed = 0
    for idx in by_group.values():
        if any(out[i] != 0.0 for i in idx):
            continue
        if any("valid" not in items[i].values for i in idx):
            raise ValueError("unplayable_group_advantages needs the reward component 'valid' in every item")
        if all(items[i].values["valid"] == 0.0 for i in idx):
            out[idx] = value
            changed += 1
    return out, changed


def _leaves(tree) -> list:
    from mlx.utils import tree_flatten

    return [v for _, v in tree_flatten(tree)]


def zero_variance_groups(items) -> tuple[int, set[int]]:
    """(number of groups, ids of groups whose rewards are all equal)."""
    by_group: dict[int, list[float]] = {}
    for it in items:
        by_group.setdefault(it.group, []).append(it.reward)
    dead = set()
    for g, r in by_group.items():
        if group_advantages(r, [0] * len(r))[1]:
            dead.add(g)
    return len(by_group), dead
