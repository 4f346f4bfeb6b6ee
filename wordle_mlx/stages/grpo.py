"""`wordle-mlx train`: GRPO with LoRA that plays complete Wordle games every step.

Each step draws B prompts (a train-split secret and a seeded board, generated on the fly with
`seeding.seed_history`), rolls them out G times in one lockstep batch
(`episode` mode) or samples G replies per turn of one trajectory (`turn` mode), scores them with
`game/rewards.py`, and makes one clipped-ratio policy-gradient update of the LoRA weights
(`llm/training/grpo_step.py`, `llm/training/grpo_loss.py`). Unlike textbook GRPO there is one update per batch, so the old
log-probs are the update's own float32 forward pass under `stop_gradient` (as TRL does with one iteration):
the ratio is exactly 1 whatever the model's dtype and the clip never binds. Zero-variance groups are dropped
rather than trained on zero advantage, and the reference for the optional KL term is the same model with LoRA off.
The model starts from the base weights or from an SFT adapter (`model.start_adapter`, whose LoRA layout it
keeps). The configuration sections live in `grpo_config.py`. The run folder `logs/<run>/` gets
`config.json`, `metrics.jsonl` (docs/METRICS.md: `run`, `train`, `valid`), atomic checkpoints (adapters,
optimizer, RNG state, prompt cursor) every N steps, and the final mlx-lm adapter in `adapters/`. `resume`
continues a run exactly: the same next prompts and the same sampling seeds. Ctrl-C or SIGTERM ends the run
after the current step with a checkpoint (`stop_signals.py`; a second Ctrl-C drops the unfinished step and
saves the one before); K non-finite steps in a row save a checkpoint and stop with a message. Validation
(`game_eval.every`) plays the same valid-split words greedily, in the run's decoding, before the first step (the
start adapter, logged as step 0) and every N steps, and keeps the adapter with the most wins (the earliest on a
tie) in `adapters_best/`; with `game_eval.keep` "best" the run's `adapters/` is that adapter at the end (the
checkpoints stay the last step's, for `resume`). The saved adapter records the decoding it was trained for
(`decode`, `trained_tags` in adapter_config.json: GRPO trains the tags only in free decoding).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import numpy as np

from ..config import config_hash, config_relative_path, display_path, resolve_path
from ..errors import UserError
from ..fileio import remove_tree, write_json_atomic
from ..game.rewards import Rewards
from ..game.seeding import HistoryPolicy, seed_history
from ..game.solver import Solver
from ..game.splits import split_words
from ..game.words import answers, guess_list
from ..metrics import MetricsWriter, truncate_after_step
from ..progress import console, progress_bar
from ..stop_signals import StopSignals, agreed_stop
from .entropy import load_table
from ..llm.play.prompts import ADAPTER_PROMPT_KEY, choose_prompt
from ..llm.play.reply_grammar import (LetterChoices, LetterGrammar, WordTrie, adapter_decoding, decoding_record,
                                 effective_mode)
from ..llm.play.rollout import GameSpec, RolloutConfig
from .grpo_config import GRPOConfig


class NonFiniteStop(UserError):
    """Too many non-finite steps in a row: the run stopped with a checkpoint."""


def rollout_config(cfg: GRPOConfig, temperature: float, seed: int) -> RolloutConfig:
    return RolloutConfig(temperature=temperature, max_tokens_per_turn=cfg.rl.max_completion_tokens,
                         completion_batch_size=cfg.rl.completion_batch_size, seed=seed,
                         max_invalid_replies=cfg.rl.max_invalid_replies, prompt=cfg.rl.prompt,
                         decode=decode_mode(cfg))


def decode_mode(cfg: GRPOConfig) -> str:
    """The decoding mode the rollouts use (and the update scores): rl.decode, or free for a free-text format."""
    return effective_mode(cfg.rl.decode, cfg.rl.prompt, "decode" in cfg.rl.model_fields_set, "rl.decode")


def letter_choices(tokenizer, mode: str, allowed) -> LetterChoices | None:
    """What the update needs to score grammar or words decoding's letter choices (None in free decoding)."""
    if mode == "free":
        return None
    return LetterChoices(LetterGrammar.for_tokenizer(tokenizer), WordTrie(allowed) if mode == "words" else None)


def step_seed(base: int, step: int, round_: int = 0) -> int:
    """The MLX sampling seed of one rollout round: a function of the run seed and the step only."""
    return (base * 1_000_003 + step * 7919 + round_ * 104_729) % (2 ** 31)


class PromptSource:
    """Draws the next B prompts: a train-split secret and a board seeded by `prompts`' history policy."""

    def __init__(self, cfg: GRPOConfig, solver: Solver, allowed: frozenset, seed: int):
        self.train = split_words("train")
        self.solver = solver
        p = cfg.prompts
        self.policy = HistoryPolicy(tuple(p.k_weights))
        self.rng = random.Random(seed)
        self.cursor = 0

    def draw(self, n: int) -> list[GameSpec]:
        out = []
        for _ in range(n):
            secret = self.train[self.rng.randrange(len(self.train))]
            seeded, _mode = seed_history(secret, self.rng, self.solver, self.policy)
            out.append(GameSpec(secret, seeded))
        return out

    def state(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"python_random": [version, list(internal), gauss], "prompt_cursor": self.cursor}

    def restore(self, state: dict) -> None:
        version, internal, gauss = state["python_random"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.cursor = int(state["prompt_cursor"])


def load_policy(cfg: GRPOConfig):
    """(model, tokenizer, adapter_config): the model with trainable LoRA, from the base or an SFT adapter."""
    from ..llm.model.lora import adapter_config, apply_lora, freeze_lora_below, lora_parameters
    from ..llm.model.models import load_model

    adapter = str(resolve_path(cfg, cfg.model.start_adapter)) if cfg.model.start_adapter else None
    model, tokenizer = load_model(cfg.model.name, adapter_path=adapter, dtype=cfg.model.dtype)
    if adapter is not None:
        acfg = json.loads((Path(adapter) / "adapter_config.json").read_text())
        model.freeze()
        lora_layers = [m for _, m in model.named_modules() if hasattr(m, "lora_a")]
        for m in lora_layers:
            m.unfreeze(keys=["lora_a", "lora_b"], recurse=False)
        if not lora_layers:
            raise UserError(f"model.start_adapter {adapter!r}: no LoRA layers (only LoRA adapters can be trained further)")
        if cfg.lora.train_layers is not None:
            freeze_lora_below(model, cfg.lora.train_layers)
        # The adapter keeps its layout (rank, scale, layers) but not its SFT dropout: GRPO uses lora.dropout
        # (0 by default), so the update's forward pass is the policy that sampled the rollouts.
        import mlx.nn as nn
        for m in lora_layers:
            if hasattr(m, "dropout"):
                m.dropout = nn.Dropout(p=cfg.lora.dropout)
        acfg["lora_parameters"] = dict(acfg.get("lora_parameters", {}), dropout=cfg.lora.dropout)
        acfg["base_model"] = cfg.model.name
        acfg[ADAPTER_PROMPT_KEY] = cfg.rl.prompt.model_dump()
        return model, tokenizer, acfg
    params = lora_parameters(cfg.lora.rank, cfg.lora.scale, cfg.lora.dropout, cfg.lora.keys)
    apply_lora(model, cfg.lora.num_layers, params)
    return model, tokenizer, adapter_config(cfg.lora.num_layers, params, cfg.model.name, cfg.rl.prompt.model_dump())


def make_optimizer(cfg: GRPOConfig):
    import mlx.optimizers as optim

    t = cfg.training
    decay = optim.cosine_decay(t.learning_rate, max(1, t.steps - t.warmup_steps), t.learning_rate * t.min_lr_ratio)
    schedule = decay if t.warmup_steps == 0 else optim.join_schedules(
        [optim.linear_schedule(0.0, t.learning_rate, t.warmup_steps), decay], [t.warmup_steps])
    if t.optimizer == "sgd":
        return optim.SGD(learning_rate=schedule, weight_decay=t.weight_decay), schedule
    return optim.AdamW(learning_rate=schedule, weight_decay=t.weight_decay), schedule


def validate(model, tokenizer, cfg: GRPOConfig, words: list[str], allowed: frozenset, step: int, world) -> dict:
    """Play the fixed validation words (each rank its share, results gathered in the words' order)."""
    from ..llm.training.distributed import interleave
    from ..llm.training.step_metrics import game_counts, rates_from_counts
    from ..llm.play.rollout import play_games

    rcfg = rollout_config(cfg, 0.0, step_seed(cfg.training.seed, 0, 1))
    mine = world.shard(words)
    episodes = play_games(model, tokenizer, [GameSpec(w) for w in mine], rcfg, allowed) if mine else []
    replies = [t for ep in episodes for t in ep.turns]
    parts = world.gather_json({"counts": game_counts(episodes, replies), "games": [ep.outcome() for ep in episodes]},
                              "all_gather of validation games")
    return {"kind": "valid", "step": step, "time": time.time(), **rates_from_counts([p["counts"] for p in parts]),
            "games": interleave([p["games"] for p in parts])}


def run(cfg: GRPOConfig, generate_fn=None) -> dict:
    import mlx.core as mx

    from ..llm.training import grpo_step, step_metrics
    from ..llm.play.generation import BatchedGenerator
    from ..llm.training.grpo_loss import LossSettings
    from ..llm.training.distributed import NullWriter, check_world_size, init_world, write_weights_hash
    from ..llm.model.lora import latest_checkpoint, load_checkpoint, prune_checkpoints, save_adapters, save_checkpoint
    from ..llm.model.logits import set_grad_checkpoint
    from ..llm.model.memory import configure_metal_memory, free_cache

    if cfg.model.start_adapter:   # play with the prompts the SFT adapter was trained on, unless rl.prompt is set
        prompt = choose_prompt(cfg.rl.prompt, "prompt" in cfg.rl.model_fields_set, resolve_path(cfg, cfg.model.start_adapter))
        cfg = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"prompt": prompt})})
    t, rl = cfg.training, cfg.rl
    world = init_world()                 # under mlx.launch: this rank's share of every batch; else a group of one
    world.check_divisible(t.batch_prompts, "training.batch_prompts")
    main, show = world.is_main, cfg.progress and world.is_main     # rank 0 alone writes files and prints
    run_dir = None
    if main and cfg.resume:
        run_dir = Path(cfg.resume)
        if not (run_dir / "metrics.jsonl").is_file():
            raise UserError(f"resume: {run_dir} is not a run folder (no metrics.jsonl)")
    elif main:
        name = cfg.run_name or time.strftime("grpo-%Y%m%d-%H%M%S")
        run_dir = resolve_path(cfg, cfg.logs_dir).resolve() / name
        if (run_dir / "metrics.jsonl").exists() or (run_dir / "config.json").exists():
            if not cfg.overwrite:
                raise UserError(f"run folder {display_path(run_dir)} already exists; pass --overwrite, pick another "
                                f"run_name or use --resume {display_path(run_dir)}")
            remove_tree(run_dir)   # a kill midway leaves the old run whole or gone
    run_dir = Path(world.broadcast_json(str(run_dir) if main else None))
    # config.json's paths are relative to the run folder (what load_config resolves them against on --resume)
    # while the run folder and they lie inside the working folder, so the run can move with its checkout
    saved_cfg = cfg.model_dump(mode="json")
    if cfg.model.start_adapter:
        saved_cfg["model"]["start_adapter"] = config_relative_path(resolve_path(cfg, cfg.model.start_adapter), run_dir)
    saved_cfg["resume"] = None
    saved_cfg["overwrite"] = False
    saved_cfg["logs_dir"] = config_relative_path(run_dir.parent, run_dir)
    saved_cfg["run_name"] = run_dir.name

    table = load_table(show_progress=show)
    solver = Solver(table)
    allowed = frozenset(guess_list())
    rewards = Rewards(cfg.reward, answers(), mode=rl.mode)
    prompts = PromptSource(cfg, solver, allowed, t.seed)
    valid_words = split_words("valid")[:cfg.game_eval.games]
    mx.random.seed(t.seed)                       # LoRA's random init depends only on the run seed
    model, tokenizer, acfg = load_policy(cfg)
    if world.is_main:
        from .plan import warn_if_over_working_set
        warn_if_over_working_set("grpo", cfg)    # one line on stderr when the plan exceeds this machine's memory
    configure_metal_memory()
    if t.grad_checkpoint:
        set_grad_checkpoint(model)
    optimizer, schedule = make_optimizer(cfg)
    optimizer.init(model.trainable_parameters())  # full state from step 0, so every checkpoint has all of it
    mode = decode_mode(cfg)
    start_tags = adapter_decoding(resolve_path(cfg, cfg.model.start_adapter) if cfg.model.start_adapter else None)[1]
    acfg.update(decoding_record(mode, mode == "free" or bool(start_tags)))
    generate = generate_fn or BatchedGenerator(model, tokenizer, mode=mode, words=allowed)
    settings = grpo_step.UpdateSettings(
        LossSettings(beta=cfg.grpo.beta, temperature=rl.temperature, letters=letter_choices(tokenizer, mode, allowed)),
        "token", cfg.grpo.advantage, t.max_grad_norm, t.max_tokens_per_microbatch,
        t.max_loss_tokens_per_microbatch)
    player = grpo_step.Player(model, tokenizer, generate)
    group = grpo_step.GroupSettings(rl.num_generations, rl.turn_continue if rl.mode == "turn" else "best",
                                    rl.trains_greedy)
    rollout = grpo_step.rollout_turn_mode if rl.mode == "turn" else grpo_step.rollout_episode_mode

    st = {"best_win_rate": None, "best_step": None, "nonfinite_in_row": 0, "nonfinite_total": 0}
    step = 0
    if cfg.resume:
        saved = None
        if main:                         # rank 0 reads the checkpoint; the others receive it below
            ckpt = latest_checkpoint(run_dir / "checkpoints")
            if ckpt is None:
                raise UserError(f"resume: {run_dir} has no complete checkpoint")
            saved = load_checkpoint(ckpt, model, optimizer)
        saved = world.broadcast_json(saved)
        check_world_size(saved, world, f"resume {run_dir}")
        step = int(saved["step"])
        prompts.restore(saved)
        kind, keys, pos, has_gauss, gauss = saved["numpy_random"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
        st.update({k: saved.get(k, st[k]) for k in st})
    elif main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / "config.json", saved_cfg)
    world.broadcast_training_state(model, optimizer)     # every rank starts from rank 0's weights and moments

    def rank_seed(seed: int) -> int:
        """Each rank samples its games from its own stream (rank 0's is the single-process one)."""
        return (seed + world.rank * 15_485_863) % (2 ** 31)

    def checkpoint(at: int) -> Path:
        if not main:
            return run_dir / "checkpoints"
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state = {**prompts.state(), **st, "run": run_dir.name, "mx_seed_next": step_seed(t.seed, at + 1),
                 "world_size": world.size,
                 "numpy_random": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)]}
        path = save_checkpoint(run_dir / "checkpoints", at, model, optimizer, acfg, state)
        prune_checkpoints(run_dir / "checkpoints", t.keep_checkpoints)
        return path

    if cfg.resume and main:
        truncate_after_step(run_dir / "metrics.jsonl", step)   # steps logged after the checkpoint are redone
    metrics = MetricsWriter(run_dir / "metrics.jsonl") if main else NullWriter()
    metrics.write({"kind": "run", "stage": "grpo", "run": run_dir.name, "config_hash": config_hash(saved_cfg),
                   "config": saved_cfg, "time": time.time(), "resumed_from_step": step if cfg.resume else None,
                   "world_size": world.size, "decode": mode})
    stop_reason, last, before_step, done_step = "finished", {}, prompts.state(), step

    def validation(at: int) -> None:
        """Play the validation words, log them, and keep the adapter if it wins more than any before."""
        rec = validate(model, tokenizer, cfg, valid_words, allowed, at, world)
        free_cache()
        better = st["best_win_rate"] is None or rec["win_rate"] > st["best_win_rate"]
        metrics.write({**rec, "best": better})
        if better:
            st["best_win_rate"], st["best_step"] = rec["win_rate"], at
            if main:
                save_adapters(run_dir / "adapters_best", model, acfg)

    if cfg.game_eval.every and step == 0:
        validation(0)                    # the start adapter, the curve's step 0
    stop, stop_signal = StopSignals(announce=main), None
    try:
        with stop, progress_bar("grpo", t.steps, enabled=show) as advance:
            advance(step)
            while step < t.steps:
                step += 1
                mx.reset_peak_memory()
                lr = float(schedule(optimizer.step))
                before_step = prompts.state()
                specs = world.shard(prompts.draw(t.batch_prompts))   # prompts rank, rank + size, ... of the batch
                mx.random.seed(rank_seed(step_seed(t.seed, step)))
                rcfg = rollout_config(cfg, rl.temperature, rank_seed(step_seed(t.seed, step)))
                out = rollout(player, specs, rcfg, allowed, rewards, group)
                items, episodes, replies = list(out.items), list(out.episodes), list(out.replies)
                tokens, rollout_s = out.tokens_generated, out.seconds
                free_cache()                     # the rollout's KV caches, before the update's activations
                upd = grpo_step.policy_update(model, optimizer, items, settings, world)
                if upd.finite:
                    st["nonfinite_in_row"] = 0
                else:
                    st["nonfinite_in_row"] += 1
                    st["nonfinite_total"] += 1
                parts = world.gather_json({      # every rank's games, so the metrics cover the whole batch
                    "rewards": [it.reward for it in items], "values": [it.values for it in items],
                    "counts": step_metrics.game_counts(episodes, replies), "games": [ep.outcome() for ep in episodes],
                    "tokens": tokens, "seconds": [rollout_s, upd.seconds, mx.get_peak_memory() / 1e9]})
                totals = np.array([r for p in parts for r in p["rewards"]])
                slowest = np.max([p["seconds"] for p in parts], axis=0).tolist()
                last = {"kind": "train", "step": step, "time": time.time(), "lr": lr, "loss": upd.loss,
                        "kl": upd.kl, "grad_norm": upd.grad_norm,
                        "reward_mean": float(totals.mean()), "reward_std": float(totals.std()),
                        "rewards": step_metrics.value_stats([v for p in parts for v in p["values"]]),
                        **step_metrics.rates_from_counts([p["counts"] for p in parts]),
                        "groups": upd.groups, "skipped_groups": upd.skipped_groups,
                        "skipped_group_share": upd.skipped_groups / upd.groups if upd.groups else 0.0,
                        "nonfinite_skips": st["nonfinite_total"],
                        "tokens_generated": sum(p["tokens"] for p in parts),
                        "trained_tokens": upd.trained_tokens, "rollout_seconds": slowest[0],
                        "update_seconds": slowest[1], "peak_memory_gb": slowest[2],
                        "games": [g for p in parts for g in p["games"]]}
                metrics.write(last)
                done_step = step
                rate = last["tokens_generated"] / last["rollout_seconds"] if last["rollout_seconds"] > 0 else 0.0
                advance(1, info=f"win {100 * last['win_rate']:.0f}%  reward {last['reward_mean']:.3f}  "
                                f"loss {upd.loss:.4f}  {rate:.0f} gen tok/s")
                if st["nonfinite_in_row"] >= t.max_nonfinite_in_a_row:
                    path = checkpoint(step)
                    raise NonFiniteStop(f"stopping at step {step}: the loss or gradient was not finite "
                                        f"{st['nonfinite_in_row']} steps in a row (updates skipped); "
                                        f"checkpoint saved in {display_path(path)}")
                if cfg.game_eval.every and (step % cfg.game_eval.every == 0 or step == t.steps):
                    validation(step)
                if t.save_every and step % t.save_every == 0:
                    checkpoint(step)
                if step < t.steps:
                    stop_signal = agreed_stop(stop, world)
                    if stop_signal:
                        stop_reason = f"stopped by {stop_signal}"
                        break
    except KeyboardInterrupt:
        stop_reason, stop_signal = "interrupted", "SIGINT"
        if done_step != step:        # the interrupted step never finished: forget its prompts
            step = done_step
            prompts.restore(before_step)
        console.print(f"interrupted: saving a checkpoint at step {step}")
    finally:
        metrics.close()
    path = checkpoint(step)
    write_weights_hash(model, world, "grpo")
    best = run_dir / "adapters_best"
    keep_best = cfg.game_eval.keep == "best" and st["best_step"] is not None and stop_reason == "finished"
    if main:
        if keep_best:
            copy_adapter(best, run_dir / "adapters")
        else:
            save_adapters(run_dir / "adapters", model, acfg)
        kept = f" (the best validation step's, {st['best_step']})" if keep_best else ""
        console.print(f"{stop_reason} at step {step}: adapters{kept} in {display_path(run_dir / 'adapters')}, "
                      f"checkpoint {display_path(path)}")
    return {"run": display_path(run_dir), "step": step, "stopped": stop_reason, "signal": stop_signal,
            "adapters": display_path(run_dir / "adapters"), "checkpoint": display_path(path),
            "best_valid_step": st["best_step"], "best_valid_win_rate": st["best_win_rate"],
            "adapters_are": "best" if keep_best else "last",
            "last": {k: v for k, v in last.items() if k != "games"}}


def copy_adapter(source: Path, target: Path) -> None:
    """Replace the adapter folder `target` with a copy of `source` (copied beside it, then renamed)."""
    tmp = target.with_name(f".{target.name}.copy")
    if tmp.exists():
        remove_tree(tmp)
    shutil.copytree(source, tmp)
    if target.exists():
        remove_tree(target)
    tmp.rename(target)
