"""`wordle-mlx train`: GRPO with LoRA that plays Wordle games every step, in the shared training loop.

Each step draws B prompts (a train-split secret and a board seeded with earlier guesses, `PromptSource`), plays
one game per prompt while sampling G replies to each of its boards (`llm/training/grpo_step.py`), scores every
reply from the game state (`game/rewards.py`) and makes one policy-gradient update of the LoRA weights over the
groups whose rewards differ. Rollouts and update use the run's decoding (`decode`): in grammar and words decoding
the update scores the letters over the same allowed letters the sampler chose from. The model starts from the
base weights or from an SFT adapter (`model.adapter`, whose LoRA layout and recorded prompt it keeps). Validation
(`validation.every`) plays the same valid-split words greedily before the first step (the start adapter, step 0)
and every N steps, from the empty board, from seeded boards or both (`validation.history`), and the run's
adapters/ at the end is the one with the most wins (adapters_best/; the earliest on a tie). Run folder,
checkpoints, resume, metrics and stop signals are the shared loop's (`llm/training/trainer.py`); a checkpoint
carries the prompt stream and numpy's random state, and the sampling seed is a function of the run seed and the
step, so a resumed run plays what an uninterrupted one would.
"""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np

from ..game.rewards import Rewards
from ..game.seeding import HistoryPolicy, eval_board, seed_history
from ..game.solver import Solver
from ..game.splits import split_words
from ..game.words import answers, guess_list
from ..llm.model.memory import free_cache
from ..llm.play.generation import BatchedGenerator
from ..llm.play.prompts import PromptConfig, adapter_prompt
from ..llm.play.reply_grammar import LetterChoices, LetterGrammar, WordTrie, effective_mode
from ..llm.play.rollout import GameSpec, RolloutConfig, play_games
from ..llm.training import grpo_step, step_metrics
from ..llm.training.distributed import init_world, interleave
from ..llm.training.grpo_loss import LossSettings
from ..llm.training.policy import load_policy, start_adapter
from ..llm.training.trainer import Task, make_optimizer, open_run, train
from .entropy import load_table
from .grpo_config import ROLLOUT_BATCH, GRPOConfig
from .plan import warn_if_over_working_set


def step_seed(base: int, step: int, round_: int = 0) -> int:
    """The MLX sampling seed of one rollout round: a function of the run seed and the step only."""
    return (base * 1_000_003 + step * 7919 + round_ * 104_729) % (2 ** 31)


class PromptSource:
    """Draws the next B prompts: a train-split secret and a board seeded by the history policy `k_weights`."""

    def __init__(self, k_weights: list[float], solver: Solver, seed: int):
        self.train = split_words("train")
        self.solver = solver
        self.policy = HistoryPolicy(tuple(k_weights))
        self.rng = random.Random(seed)

    def draw(self, n: int) -> list[GameSpec]:
        out = []
        for _ in range(n):
            secret = self.train[self.rng.randrange(len(self.train))]
            seeded, _mode = seed_history(secret, self.rng, self.solver, self.policy)
            out.append(GameSpec(secret, seeded))
        return out

    def state(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        kind, keys, pos, has_gauss, np_gauss = np.random.get_state()
        return {"python_random": [version, list(internal), gauss],
                "numpy_random": [kind, keys.tolist(), int(pos), int(has_gauss), float(np_gauss)]}

    def restore(self, state: dict) -> None:
        version, internal, gauss = state["python_random"]
        self.rng.setstate((version, tuple(internal), gauss))
        kind, keys, pos, has_gauss, np_gauss = state["numpy_random"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, np_gauss))


def letter_choices(tokenizer, mode: str, allowed) -> LetterChoices | None:
    """What the update needs to score grammar or words decoding's letter choices (None in free decoding)."""
    if mode == "free":
        return None
    return LetterChoices(LetterGrammar.for_tokenizer(tokenizer), WordTrie(allowed) if mode == "words" else None)


def validation_games(words: list[str], history: str, solver: Solver) -> dict[str, list[GameSpec]]:
    """The validation games by kind: each word from the empty board ("empty"), from the board `eval --history
    seeded` gives it at seed 0 ("seeded"), or both (`validation.history` none, seeded, both)."""
    games = {}
    if history in ("none", "both"):
        games["empty"] = [GameSpec(w) for w in words]
    if history in ("seeded", "both"):
        games["seeded"] = [GameSpec(w, eval_board(w, 0, solver)) for w in words]
    return games


def validate(model, tokenizer, rcfg: RolloutConfig, games: dict[str, list[GameSpec]], allowed: frozenset,
             world) -> dict:
    """Play the fixed validation games greedily (each rank its share, results gathered in the games' order); the
    rates are over all of them, with each kind's win rate (`win_rate_empty`, `win_rate_seeded`) beside."""
    record, counts, outcomes = {}, [], []
    for kind, specs in games.items():
        mine = world.shard(specs)
        episodes = play_games(model, tokenizer, mine, rcfg, allowed) if mine else []
        replies = [t for ep in episodes for t in ep.turns]
        parts = world.gather_json({"counts": step_metrics.game_counts(episodes, replies),
                                   "games": [ep.outcome() for ep in episodes]},
                                  f"all_gather of {kind} validation games")
        counts += [p["counts"] for p in parts]
        outcomes += interleave([p["games"] for p in parts])
        record[f"win_rate_{kind}"] = step_metrics.rates_from_counts([p["counts"] for p in parts])["win_rate"]
    return {**step_metrics.rates_from_counts(counts), **record, "games": outcomes}


def step_record(upd, out, parts: list[dict]) -> dict:
    """The metrics of one step from every rank's rollout and the update."""
    totals = np.array([r for p in parts for r in p["rewards"]])
    slowest = np.max([p["seconds"] for p in parts], axis=0).tolist()
    return {"loss": upd.loss, "kl": upd.kl, "grad_norm": upd.grad_norm, "applied": upd.applied,
            "finite": upd.finite, "reward_mean": float(totals.mean()), "reward_std": float(totals.std()),
            "rewards": step_metrics.value_stats([v for p in parts for v in p["values"]]),
            **step_metrics.rates_from_counts([p["counts"] for p in parts]),
            "groups": upd.groups, "skipped_groups": upd.skipped_groups,
            "skipped_group_share": upd.skipped_groups / upd.groups if upd.groups else 0.0,
            "tokens_generated": sum(p["tokens"] for p in parts), "trained_tokens": upd.trained_tokens,
            "rollout_seconds": slowest[0], "update_seconds": slowest[1], "peak_memory_gb": slowest[2],
            "games": [g for p in parts for g in p["games"]]}


def grpo_task(cfg: GRPOConfig, player: grpo_step.Player, optimizer, prompt: PromptConfig, mode: str,
              world) -> Task:
    """One GRPO step: draw B prompts, play and score them, and update on the groups with a spread."""
    model, tokenizer, rl = player.model, player.tokenizer, cfg.rl
    allowed = frozenset(guess_list())
    rewards = Rewards(cfg.reward.weights(), answers())
    solver = Solver(load_table(show_progress=cfg.run.progress and world.is_main))
    prompts = PromptSource(rl.k_weights, solver, cfg.run.seed)
    settings = grpo_step.UpdateSettings(LossSettings(beta=rl.beta, temperature=rl.temperature,
                                                     letters=letter_choices(tokenizer, mode, allowed)),
                                        cfg.optimizer.max_grad_norm, rl.max_tokens_per_microbatch,
                                        rl.max_loss_tokens_per_microbatch)
    valid_games = validation_games(split_words("valid")[:cfg.validation.games], cfg.validation.history, solver)

    def rollout_config(temperature: float, seed: int) -> RolloutConfig:
        return RolloutConfig(temperature=temperature, max_tokens_per_turn=cfg.max_tokens, seed=seed, prompt=prompt,
                             decode=mode, completion_batch_size=ROLLOUT_BATCH)

    def step(at: int) -> dict:
        specs = world.shard(prompts.draw(rl.batch_prompts))    # prompts rank, rank + size, ... of the batch
        seed = (step_seed(cfg.run.seed, at) + world.rank * 15_485_863) % (2 ** 31)   # each rank its own stream
        mx.random.seed(seed)
        out = grpo_step.rollout(player, specs, rollout_config(rl.temperature, seed), allowed, rewards,
                                rl.num_generations)
        free_cache()                     # the rollout's KV caches, before the update's activations
        upd = grpo_step.policy_update(model, optimizer, out.items, settings, world)
        parts = world.gather_json({      # every rank's games, so the metrics cover the whole batch
            "rewards": [it.reward for it in out.items], "values": [it.values for it in out.items],
            "counts": step_metrics.game_counts(out.episodes, out.replies),
            "games": [ep.outcome() for ep in out.episodes], "tokens": out.tokens_generated,
            "seconds": [out.seconds, upd.seconds, mx.get_peak_memory() / 1e9]})
        return step_record(upd, out, parts)

    def validation(at: int) -> dict | None:
        if not cfg.validation.games:
            return None
        return validate(model, tokenizer, rollout_config(0.0, step_seed(cfg.run.seed, 0, 1)), valid_games, allowed,
                        world)

    def info(r: dict) -> str:
        rate = r["tokens_generated"] / r["rollout_seconds"] if r["rollout_seconds"] > 0 else 0.0
        return (f"win {100 * r['win_rate']:.0f}%  reward {r['reward_mean']:.3f}  loss {r['loss']:.4f}  "
                f"{rate:.0f} gen tok/s")

    return Task(kinds=("train", "valid"), step=step, validate=validation, state=prompts.state,
                restore=prompts.restore, info=info, keep_best=True, run_fields={"decode": mode})


def run(cfg: GRPOConfig, generate_fn=None) -> dict:
    world = init_world()                 # under mlx.launch: this rank's share of every batch; else a group of one
    world.check_divisible(cfg.rl.batch_prompts, "rl.batch_prompts")
    run_dir = open_run(cfg, world)          # a run folder in the way is refused before anything loads
    prompt = adapter_prompt(start_adapter(cfg)) or PromptConfig()    # the prompt the start adapter was trained on
    mode = effective_mode(cfg.decode, prompt, "decode" in cfg.model_fields_set)
    model, tokenizer, adapter_cfg, trainable = load_policy(cfg, prompt, mode, False)
    if world.is_main:
        warn_if_over_working_set("grpo", cfg)    # one line on stderr when the plan exceeds this machine's memory
    optimizer, schedule = make_optimizer(cfg.optimizer, cfg.run.steps)
    generate = generate_fn or BatchedGenerator(model, tokenizer, mode=mode, words=frozenset(guess_list()))
    task = grpo_task(cfg, grpo_step.Player(model, tokenizer, generate), optimizer, prompt, mode, world)
    task.saved_paths = {"model.adapter": start_adapter(cfg)}
    task.describe = (f"{cfg.rl.batch_prompts} boards x {cfg.rl.num_generations} replies a step in {mode} decoding, "
                     f"{trainable / 1e6:.2f}M trainable parameters")
    return train(cfg, task, run_dir, model, optimizer, schedule, adapter_cfg, world)
