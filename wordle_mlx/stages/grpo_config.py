"""The `wordle-mlx train` (GRPO) config: the shared training shape (`train_config.py`) plus `rl` and `reward`.

`rl` sets how a step plays and learns: B boards a step (a train-split secret and a board seeded with 0-4 earlier
guesses, drawn by `k_weights`), G sampled replies to each board of each game at `temperature` (the group, which
the greedy reply joins as member G + 1 while the game goes on with it), the KL weight `beta`, and the micro-batch
size of the update (padded tokens; a pass scores at most an eighth of them, `LOSS_TOKENS_DIVISOR`). `reward`
weighs the per-reply components of `game/rewards.py` against a win, worth 1. Defaults are the 270M recipe's GRPO
stage. Every section forbids unknown keys, so a misspelt field is a one-line error naming the file and the field.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from ..config import StrictModel
from ..game.rewards import RewardWeights
from ..game.seeding import HistoryPolicy
from .train_config import ModelSection, OptimizerSection, RunSection, TrainConfig, ValidationSection


ROLLOUT_BATCH = 128         # replies decoded together: the recipe step's 8 x (8 + 1) in one lockstep batch
LOSS_TOKENS_DIVISOR = 8     # a pass of the update scores at most 1/8 of its padded tokens: 256 logit rows of 2048


class RLSection(StrictModel):
    batch_prompts: int = Field(8, ge=1, description="B: boards (games) per step.")
    num_generations: int = Field(8, ge=2, description="G: replies sampled to each board, the group.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the G replies.")
    beta: float = Field(0.0, ge=0, description="KL weight to the reference policy, the model with LoRA switched off.")
    k_weights: list[float] = Field([0.7, 0.1, 0.1, 0.1], description="P(k seeded guesses on a step's board), "
                                   "k = 0, 1, ...")
    max_tokens_per_microbatch: int = Field(2048, ge=16, description="Padded tokens per forward/backward pass of the "
                                           "update; in free decoding its reply tokens, each a logit row over the "
                                           "vocabulary, are capped at an eighth of it (256 of 2048). Lower it to save "
                                           "memory.")

    @property
    def max_loss_tokens_per_microbatch(self) -> int:
        """Reply tokens (logit rows) per pass of the update: max_tokens_per_microbatch / LOSS_TOKENS_DIVISOR."""
        return self.max_tokens_per_microbatch // LOSS_TOKENS_DIVISOR

    @model_validator(mode="after")
    def _check_k_weights(self) -> "RLSection":
        HistoryPolicy(tuple(self.k_weights))
        return self


class RewardSection(StrictModel):
    """Weights of the per-reply components; a winning reply scores 1 + early x (its guesses to spare)."""
    early: float = Field(4.5, ge=0, description="A win in n guesses adds early x (6 - n) / 5.")
    format: float = Field(0.05, ge=0, description="+1 a well-formed reply, -1 a format error.")
    valid: float = Field(0.3, ge=0, description="1 for an allowed word.")
    consistent: float = Field(0.3, ge=0, description="1 for a word that fits every clue on the board.")
    info_gain: float = Field(0.1, ge=0, description="The guess's feedback entropy over the fitting answers, / log2 "
                             "of their count.")
    repeat: float = Field(0.35, ge=0, description="-1 for a word already on the board.")

    def weights(self) -> RewardWeights:
        """The `game/rewards.py` weights (a win is the unit), checked against the reward invariants."""
        return RewardWeights(win=1.0, length=0.0, **self.model_dump())


class GRPOModel(ModelSection):
    adapter: str | None = Field("logs/sft/adapters", description="Start from this adapter folder (relative to the "
                                "config file, or to the working folder without one): its LoRA layout, weights and "
                                "recorded prompt. The default is what `wordle-mlx sft` writes with no config; "
                                "None = a fresh LoRA (`lora`) on the base model.")


class GRPOOptimizer(OptimizerSection):
    name: Literal["adamw", "sgd"] = Field("sgd", description="sgd moves each weight in proportion to its "
                      "clipped gradient (a step's norm is learning_rate x min(grad norm, max_grad_norm)); adamw "
                      "moves every weight by about the learning rate.")
    learning_rate: float = Field(0.02, gt=0, description="Peak learning rate (0.02 suits sgd, about 1e-5 adamw).")


class GRPORun(RunSection):
    name: str | None = Field("grpo", description="Run folder name under logs_dir; None = grpo-<date>-<time>.")
    steps: int = Field(100, ge=1, description="Policy updates.")
    save_every: int = Field(10, ge=0, description="Checkpoint every N steps (and at the end); 0 = only at the end.")


class GRPOValidation(ValidationSection):
    every: int = Field(20, ge=0, description="Play the validation games before the first step (the start adapter, "
                       "step 0), every N steps and at the end; the adapter with the most wins is the run's; 0 = never.")
    games: int = Field(100, ge=0, description="The first N valid-split words, played greedily in the run's decoding.")
    history: Literal["none", "seeded", "both"] = Field(
        "none", description="Where the validation games start: the empty board (none), the board `eval --history "
        "seeded` gives each word (seeded), or both (2N games); the adapter kept is the one with the most wins in all.")


class GRPOConfig(TrainConfig):
    STAGE: ClassVar[str] = "grpo"
    model: GRPOModel = Field(default_factory=GRPOModel)
    optimizer: GRPOOptimizer = Field(default_factory=GRPOOptimizer)
    run: GRPORun = Field(default_factory=GRPORun)
    validation: GRPOValidation = Field(default_factory=GRPOValidation)
    rl: RLSection = Field(default_factory=RLSection)
    reward: RewardSection = Field(default_factory=RewardSection)

    @model_validator(mode="after")
    def _check_reward(self) -> "GRPOConfig":
        try:
            self.reward.weights().check()
        except ValueError as exc:
            raise ValueError(f"reward: {exc}") from None
        return self
