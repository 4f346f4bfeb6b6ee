"""GRPO on Wordle, read top to bottom: play and score, advantages, the loss, and the batches the trainer steps through.

1. Rollout (`rollout`): one game per prompt (a secret and a seeded board). At each turn G replies are sampled
   from the same board (`rollout.sample_replies_and_greedy`: every game's G samples and its greedy reply in one
   batch), each scored with the per-reply reward from the game state (`Rewards.turn_mode_values`); the group is the
   (prompt, turn), which the greedy reply joins as member G + 1, and the game goes on with the greedy reply, so the
   boards, error messages included, are the ones greedy evaluation reaches and the update pushes the reply greedy
   play gives up or down.
2. Advantages (`live_sequences`): (r - mean) / std within each group (`advantages.py`); groups whose rewards do
   not differ carry no gradient and are dropped.
3. Loss (`grpo_loss`): sum_t w_t * -(rho_t A_t) + beta * KL_t, rho_t = exp(new_t - stop_gradient(new_t)), with
   new = log_softmax(logits / T) at the sampled token (or letter choice) in float32 and w_t = 1 / (the step's model
   tokens over every rank), DAPO's token mean. GRPO makes one update per rollout, so the old policy is the one being
   trained: rho_t is 1 in value and its gradient is the policy gradient A_t * grad(new_t) (PPO's clip never binds
   at a ratio of 1, so there is none). KL_t is the k3 estimator exp(ref - new) - (ref - new) - 1 to the reference
   policy, the same model with its LoRA switched off (`lora_disabled`: no second copy of the weights).
4. The step's batch (`policy_batch`, `GRPOBatches`): the live replies packed into micro-batches (`packing.py`),
   which the trainer (`trainer.py`) turns into one update. `policy_update` is that update on its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...game.rewards import ReplyKind, Rewards, TurnFacts
from ..model.logits import grad_checkpointed, has_split_head, project, selected_logprobs, target_logprobs
from ..model.packed import packed_groups_hidden
from ..model.lora import lora_disabled
from ..model.memory import free_cache
from ..play.episode import Episode, TokenSequence, Turn, reply_sequence
from ..play.games import game_counts, rates_from_counts
from ..play.prompts import FORMAT_ERRORS, NOT_A_WORD, parse_reply
from ..play.rollout import (Completion, GameSpec, RolloutConfig, apply_reply, prompt_token_ids,
                            sample_replies_and_greedy, start_game)
from .advantages import group_advantages
from .distributed import World
from .packing import batch_arrays, micro_batches
from .step_metrics import value_stats
from .trainer import Batch, train_step


# 1. Rollout: play and score

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


# 2. Advantages

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


# 3. The loss

@dataclass
class LossSettings:
    beta: float = 0.0
    temperature: float = 1.0               # the temperature of the rollout log-probs
    letters: object = None                 # reply_grammar.LetterChoices in grammar/words decoding, else None


def policy_logprobs(model, arrays: dict, temperature: float) -> mx.array:
    """The micro-batch's log-probs of its model tokens: several prompts' replies as one packed stream
    (`packed.packed_groups_hidden`) unless gradient checkpointing is on (it checkpoints the padded path's blocks),
    else `selected_logprobs`."""
    packed = arrays.get("packed")
    choices = arrays.get("choices")
    if packed is not None and not grad_checkpointed(model):
        logits = project(model, packed_groups_hidden(model, packed), None if choices is None else choices["ids"])
        return target_logprobs(logits.astype(mx.float32), arrays["targets"], temperature, choices)
    return selected_logprobs(model, arrays["inputs"], arrays["positions"], arrays["targets"], temperature,
                             arrays.get("prefix"), choices)


def reference_logprobs(model, arrays: dict, temperature: float):
    """Log-probs of the model tokens under the reference policy, the model with LoRA off, without gradient."""

    def logprobs():
        ref = mx.stop_gradient(policy_logprobs(model, arrays, temperature))
        mx.eval(ref)
        return ref

    with lora_disabled(model) as n:
        if n == 0:
            raise ValueError("beta > 0 needs LoRA layers: the reference policy is the model with LoRA switched off")
        return logprobs()


def grpo_loss(model, arrays: dict, settings: LossSettings, ref_logprobs=None):
    """(loss, stats) for one micro-batch; stats are weighted sums (kl) to add across micro-batches."""

    new = policy_logprobs(model, arrays, settings.temperature)
    w, adv = arrays["weights"], arrays["adv"]
    per_token = -mx.exp(new - mx.stop_gradient(new)) * adv          # see the module docstring
    kl = mx.zeros_like(new)
    if settings.beta > 0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs the reference log-probs")
        diff = ref_logprobs - new
        kl = mx.exp(diff) - diff - 1.0
        per_token = per_token + settings.beta * kl
    return (w * per_token).sum(), {"kl": (w * kl).sum()}


def grpo_loss_fn(settings: LossSettings):
    """The trainer's loss: `grpo_loss` of one micro-batch (arrays, reference log-probs)."""
    return lambda model, arrays, ref: grpo_loss(model, arrays, settings, ref)


# 4. The step's batch

@dataclass
class UpdateSettings:
    loss: LossSettings
    max_grad_norm: float = 1.0           # 0 = no clipping
    max_tokens_per_microbatch: int = 2048    # padded tokens per micro-batch (the config's rl field)
    max_loss_tokens: int = 256           # model tokens per micro-batch (each a vocabulary-wide logit row; free only)
    share_prompts: bool = True           # replies to one prompt: run the prompt once (pack_shared_batch)


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


def policy_batch(model, items: Sequence[ScoredItem], s: UpdateSettings, world: World | None = None) -> Batch:
    """The trainer's `Batch` of scored `items` (this rank's share): the live groups' replies with their
    advantages and token-mean weights over every rank's model tokens, packed into micro-batches (with the
    reference log-probs when beta > 0). Its metrics: the step's groups, skipped groups and trained tokens."""
    world = world or World()
    seqs, advs, skipped = live_sequences(items)
    lengths = [sum(q.mask) for q in seqs]
    total_tokens, total_seqs, skipped, groups = world.sum_floats(
        [sum(lengths), len(seqs), skipped, len({it.group for it in items})])
    metrics = {"groups": int(groups), "skipped_groups": int(skipped), "trained_tokens": int(total_tokens)}
    if total_seqs == 0:
        return Batch([], None, {**metrics, "kl": 0.0}, trainable=False)
    weights = [np.full(n, 1.0 / total_tokens) for n in lengths]     # every token of the step counts the same
    model.train()
    packed = []
    # a letter choice is a 26-wide logit row, not a vocabulary-wide one: only the padded tokens bound its pass
    loss_cap = s.max_tokens_per_microbatch if s.loss.letters is not None else s.max_loss_tokens
    for idx, pack in micro_batches(seqs, s.share_prompts and has_split_head(model), s.max_tokens_per_microbatch,
                                   loss_cap):
        arrays = batch_arrays(pack([seqs[i] for i in idx], [advs[i] for i in idx], [weights[i] for i in idx]),
                              letters=s.loss.letters)
        packed.append((arrays, reference_logprobs(model, arrays, s.loss.temperature) if s.loss.beta > 0 else None))
    return Batch(packed, None, metrics)


def policy_update(model, optimizer, items: Sequence[ScoredItem], s: UpdateSettings, world: World | None = None
                  ) -> UpdateResult:
    """One update from scored `items` outside a run (benchmarks, tests): `policy_batch`, then the trainer's
    step (gradient, clip, finiteness check, update)."""
    start = time.perf_counter()
    world = world or World()
    batch = policy_batch(model, items, s, world)
    fields = train_step(model, optimizer, nn.value_and_grad(model, grpo_loss_fn(s.loss)), batch, s.max_grad_norm,
                        world)
    model.eval()
    return UpdateResult(fields["loss"], fields["grad_norm"], fields.get("kl", 0.0), batch.metrics["skipped_groups"],
                        fields["applied"], fields["finite"], batch.metrics["trained_tokens"],
                        time.perf_counter() - start, batch.metrics["groups"])


def step_seed(base: int, step: int, round_: int = 0) -> int:
    """The MLX sampling seed of one rollout round: a function of the run seed and the step only."""
    return (base * 1_000_003 + step * 7919 + round_ * 104_729) % (2 ** 31)


class GRPOBatches:
    """The trainer's data in GRPO: each step draws B prompts (`prompts.draw`, this rank its share), plays and scores
    them with the current model (`rollout`, sampling from a seed of (run seed, step, rank)), and yields their
    `policy_batch`, with the step's rewards, rates and games (every rank's) as its metrics. Its state is the prompt
    stream's and the number of batches drawn, so a resumed run plays what an uninterrupted one would."""

    def __init__(self, player: Player, prompts, rollout_config: Callable[[int], RolloutConfig],
                 allowed: Collection[str], rewards: Rewards, batch_prompts: int, num_generations: int, seed: int,
                 settings: UpdateSettings, world: World):
        self.player, self.prompts, self.rollout_config, self.allowed = player, prompts, rollout_config, allowed
        self.rewards, self.batch_prompts, self.num_generations = rewards, batch_prompts, num_generations
        self.seed, self.settings, self.world, self.drawn = seed, settings, world, 0

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        world = self.world
        self.drawn += 1
        specs = world.shard(self.prompts.draw(self.batch_prompts))    # prompts rank, rank + size, ... of the batch
        seed = (step_seed(self.seed, self.drawn) + world.rank * 15_485_863) % (2 ** 31)   # each rank its own stream
        mx.random.seed(seed)
        out = rollout(self.player, specs, self.rollout_config(seed), self.allowed, self.rewards, self.num_generations)
        free_cache()                     # the rollout's KV caches, before the update's activations
        batch = policy_batch(self.player.model, out.items, self.settings, world)
        parts = world.gather_json({      # every rank's games, so the metrics cover the whole batch
            "rewards": [it.reward for it in out.items], "values": [it.values for it in out.items],
            "counts": game_counts(out.episodes, out.replies), "games": [ep.outcome() for ep in out.episodes],
            "tokens": out.tokens_generated, "seconds": out.seconds})
        totals = np.array([r for p in parts for r in p["rewards"]])
        groups = batch.metrics["groups"]
        batch.metrics.update({
            "reward_mean": float(totals.mean()), "reward_std": float(totals.std()),
            "rewards": value_stats([v for p in parts for v in p["values"]]),
            **rates_from_counts([p["counts"] for p in parts]),
            "skipped_group_share": batch.metrics["skipped_groups"] / groups if groups else 0.0,
            "tokens_generated": sum(p["tokens"] for p in parts), "rollout_seconds": max(p["seconds"] for p in parts),
            "games": [g for p in parts for g in p["games"]]})
        return batch

    def state(self) -> dict:
        return {**self.prompts.state(), "batches_drawn": self.drawn}

    def restore(self, state: dict) -> None:
        self.prompts.restore(state)
        self.drawn = int(state.get("batches_drawn", state.get("step", 0)))
