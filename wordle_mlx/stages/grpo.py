"""`wordle-mlx train`: GRPO with LoRA that plays Wordle games every step, with the shared trainer.

Each step draws B prompts (a train-split secret and a board seeded with earlier guesses, `PromptSource`), plays
one game per prompt while sampling G replies to each of its boards, scores every reply from the game state
(`game/rewards.py`) and makes one policy-gradient update of the LoRA weights over the groups whose rewards
differ: `llm/training/rl.py` holds that path top to bottom (rollout, advantages, loss, the step's batch), and
`llm/training/trainer.py` makes the update. Rollouts and update use the run's decoding (`decode`): in grammar and
words decoding the update scores the letters over the same allowed letters the sampler chose from. The model
starts from the base weights or from an SFT adapter (`model.adapter`, whose LoRA layout and recorded prompt it
keeps). Validation (`validation.every`) plays the same valid-split words greedily before the first step (the start
adapter, step 0) and every N steps (`llm/play/games.py`, as eval and SFT do), from the empty board, from seeded
boards or both (`validation.history`), and the run's adapters/ at the end is the one with the most wins
(adapters_best/; the earliest on a tie). A checkpoint carries the prompt stream and numpy's random state, and the
sampling seed is a function of the run seed and the step, so a resumed run plays what an uninterrupted one would.
"""

from __future__ import annotations

import random

import numpy as np

from ..game.rewards import Rewards
from ..game.seeding import HistoryPolicy, eval_board, seed_history
from ..game.solver import Solver
from ..game.splits import split_words
from ..game.words import answers, guess_list
from ..llm.play.games import validation_record
from ..llm.play.generation import BatchedGenerator
from ..llm.play.prompts import PromptConfig, adapter_prompt
from ..llm.play.reply_grammar import LetterChoices, LetterGrammar, WordTrie, effective_mode
from ..llm.play.rollout import GameSpec, RolloutConfig
from ..llm.training.distributed import init_world
from ..llm.training.policy import load_policy, start_adapter
from ..llm.training.rl import GRPOBatches, LossSettings, Player, UpdateSettings, grpo_loss_fn, step_seed
from ..llm.training.run_folder import open_run, training_args
from ..llm.training.trainer import make_optimizer, train
from .pattern_table import load_table
from .grpo_config import ROLLOUT_BATCH, GRPOConfig
from ..planning.stage_plan import warn_if_over_working_set


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


def progress_text(r: dict) -> str:
    rate = r["tokens_generated"] / r["rollout_seconds"] if r["rollout_seconds"] > 0 else 0.0
    return (f"win {100 * r['win_rate']:.0f}%  reward {r['reward_mean']:.3f}  loss {r['loss']:.4f}  "
            f"{rate:.0f} gen tok/s")


def run(cfg: GRPOConfig, generate_fn=None) -> dict:
    world = init_world()                 # under mlx.launch: this rank's share of every batch; else a group of one
    world.check_divisible(cfg.rl.batch_prompts, "rl.batch_prompts")
    run_dir = open_run(cfg, world)          # a run folder in the way is refused before anything loads
    adapter = start_adapter(cfg)
    prompt = adapter_prompt(adapter) or PromptConfig()    # the prompt the start adapter was trained on
    mode = effective_mode(cfg.decode, prompt, "decode" in cfg.model_fields_set)
    model, tokenizer, adapter_cfg, trainable = load_policy(cfg.model, cfg.lora, cfg.run.seed, adapter, prompt, mode,
                                                           False)
    if world.is_main:
        warn_if_over_working_set("grpo", cfg)    # one line on stderr when the plan exceeds this machine's memory
    optimizer, schedule = make_optimizer(cfg.optimizer, cfg.run.steps)
    rl, allowed = cfg.rl, frozenset(guess_list())
    generate = generate_fn or BatchedGenerator(model, tokenizer, mode=mode, words=allowed)
    solver = Solver(load_table(show_progress=cfg.run.progress and world.is_main))

    def rollout_config(temperature: float, seed: int) -> RolloutConfig:
        return RolloutConfig(temperature=temperature, max_tokens_per_turn=cfg.max_tokens, seed=seed, prompt=prompt,
                             decode=mode, completion_batch_size=ROLLOUT_BATCH)

    settings = UpdateSettings(LossSettings(beta=rl.beta, temperature=rl.temperature,
                                           letters=letter_choices(tokenizer, mode, allowed)),
                              cfg.optimizer.max_grad_norm, rl.max_tokens_per_microbatch,
                              rl.max_loss_tokens_per_microbatch)
    batches = GRPOBatches(Player(model, tokenizer, generate), PromptSource(rl.k_weights, solver, cfg.run.seed),
                          lambda seed: rollout_config(rl.temperature, seed), allowed,
                          Rewards(cfg.reward.weights(), answers()), rl.batch_prompts, rl.num_generations,
                          cfg.run.seed, settings, world)
    valid_games = validation_games(split_words("valid")[:cfg.validation.games], cfg.validation.history, solver)
    valid_rollout = rollout_config(0.0, step_seed(cfg.run.seed, 0, 1))

    def evaluate(step: int) -> dict | None:
        if not cfg.validation.games:
            return None
        return validation_record(model, tokenizer, valid_games, valid_rollout, allowed, world)

    args = training_args(
        cfg, run_dir, adapter_cfg, {"model.adapter": adapter}, schedule, keep_best=True, progress_text=progress_text,
        run_fields={"decode": mode},
        describe=f"{rl.batch_prompts} boards x {rl.num_generations} replies a step in {mode} decoding, "
                 f"{trainable / 1e6:.2f}M trainable parameters")
    return train(model, optimizer, grpo_loss_fn(settings.loss), batches, args, evaluate, world=world)
