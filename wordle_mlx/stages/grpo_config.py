"""The `wordle-mlx train` (GRPO) configuration: strict pydantic sections loaded from `config/grpo*.json`.

One section per concern: `model` (base model and an optional SFT adapter to continue), `lora` (layout of fresh
LoRA layers), `training` (steps, B prompts per step, optimizer and schedule, micro-batch sizes, checkpoints),
`rl` (episode or turn mode, G, sampling, game rules, prompt format), `grpo` (clipping, KL, averaging,
advantages), `reward` (`game/rewards.py` weights, checked against the mode's invariant when the config is
loaded), `prompts` (where the B boards come from) and `validation`. Every section forbids unknown keys, so a
misspelt field is a one-line error naming the file and the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..config import MODEL_SPEC_HELP, StrictModel
from ..game.rewards import RewardWeights
from ..game.seeding import HistoryPolicy
from ..llm.prompts import PromptConfig


class ModelSection(StrictModel):
    name: str = Field("builtin:gemma-3-270m", description=MODEL_SPEC_HELP)
    adapter: str | None = Field(None, description="SFT adapter folder to start from (relative to the config file).")
    dtype: str | None = None


class LoraSection(StrictModel):
    rank: int = Field(8, ge=1, description="Ignored with model.adapter (the adapter's own rank applies).")
    scale: float = Field(20.0, gt=0, description="Ignored with model.adapter (the adapter's own scale applies).")
    dropout: float = Field(0.0, ge=0, lt=1)
    num_layers: int = Field(-1, ge=-1, description="Last N blocks get LoRA; -1 = all. Ignored with model.adapter.")
    keys: list[str] | None = Field(None, description="Ignored with model.adapter (the adapter's own keys apply).")
    train_layers: int | None = Field(None, ge=1, description=(
        "With model.adapter: only the LoRA weights of the last N blocks train; the others keep the adapter's "
        "values (and still act). None: all of the adapter's LoRA weights train."))


class TrainingSection(StrictModel):
    steps: int = Field(100, ge=1)
    batch_prompts: int = Field(2, ge=1, description="B: prompts per step.")
    learning_rate: float = Field(1e-5, gt=0)
    warmup_steps: int = Field(0, ge=0)
    min_learning_rate: float = Field(0.0, ge=0)
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description=(
        "adamw moves every weight by about the learning rate; sgd moves each weight in proportion to its clipped "
        "gradient: without momentum a step's norm is learning_rate x min(grad norm, max_grad_norm). Measured "
        "(docs/RESULTS.md, sessions 33-34): 8 GRPO steps from a 73 / 200 SFT player won 46 with adamw at 1e-5 "
        "and 65 with sgd at 0.02 (62 with four times the boards a step)."))
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd only: heavy-ball momentum.")
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, ge=0, description="0 = no clipping.")
    max_tokens_per_microbatch: int = Field(2048, ge=16, description="Padded tokens per forward/backward pass.")
    max_loss_tokens_per_microbatch: int = Field(256, ge=1, description="Model tokens per pass (vocab-sized logits each).")
    checkpoint_every: int = Field(10, ge=0, description="0 = only at the end.")
    keep_checkpoints: int = Field(3, ge=1)
    max_nonfinite_in_a_row: int = Field(3, ge=1, description="Stop after this many non-finite steps in a row.")
    seed: int = Field(0, ge=0, lt=2 ** 32)

    @model_validator(mode="after")
    def _check_momentum(self) -> "TrainingSection":
        if self.momentum and self.optimizer != "sgd":
            raise ValueError(f"momentum is for optimizer 'sgd', got optimizer {self.optimizer!r} and momentum "
                             f"{self.momentum}")
        return self


class RLSection(StrictModel):
    mode: Literal["episode", "turn"] = "episode"
    num_generations: int = Field(8, ge=2, description="G: games (episode) or replies (turn) per group.")
    max_completion_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, gt=0)
    max_turns: int = Field(6, ge=1, le=6, description="Guesses per game.")
    max_invalid_replies: int = Field(3, ge=1)
    invalid_costs_turn: bool = False
    turn_continue: Literal["best", "sampled", "greedy"] = Field(
        "best", description="Turn mode: play on with the best-scoring of the G replies, with one sampled reply, or "
        "with the policy's greedy reply (one more decode per turn; the boards are the ones greedy eval reaches).")
    train_greedy: bool = Field(False, description=(
        "Turn mode with turn_continue 'greedy': the greedy reply also joins its group as member G + 1 and is "
        "trained on, so each update pushes the reply greedy play gives up or down."))
    completion_batch_size: int = Field(64, ge=1)
    prompt: PromptConfig = Field(default_factory=PromptConfig)

    @model_validator(mode="after")
    def _check_train_greedy(self) -> "RLSection":
        if self.train_greedy and (self.mode, self.turn_continue) != ("turn", "greedy"):
            raise ValueError(f"train_greedy needs mode 'turn' and turn_continue 'greedy', got mode {self.mode!r} "
                             f"and turn_continue {self.turn_continue!r}")
        return self


class PromptsSection(StrictModel):
    source: Literal["generate", "file"] = "generate"
    path: str | None = Field(None, description="rl_train.jsonl from `wordle-mlx data` when source is 'file'.")
    k_weights: list[float] = Field([0.2, 0.2, 0.2, 0.2, 0.2], description="P(k seeded guesses), k = 0, 1, ...")
    solver: float = 0.4
    random: float = 0.45
    mistake: float = 0.15

    @model_validator(mode="after")
    def _check(self) -> "PromptsSection":
        if self.source == "file" and not self.path:
            raise ValueError("prompts.path is required when prompts.source is 'file'")
        HistoryPolicy(tuple(self.k_weights), self.solver, self.random, self.mistake)
        return self


class GRPOSection(StrictModel):
    epsilon: float = Field(0.2, gt=0, lt=1)
    epsilon_high: float | None = Field(None, gt=0)
    beta: float = Field(0.0, ge=0, description="KL weight to the reference policy, the model with LoRA switched off.")
    averaging: Literal["token", "sequence"] = "token"
    advantage: Literal["normalized", "centered"] = Field("normalized", description=(
        "'normalized': GRPO, (r - mean) / std within a group; 'centered': r - mean (Dr. GRPO)."))
    resample_zero_variance: int = Field(0, ge=0, description="Rounds of fresh prompts to replace zero-variance groups.")


class ValidationSection(StrictModel):
    every: int = Field(10, ge=0, description="Validate every N steps (and at the end); 0 = never.")
    games: int = Field(20, ge=1, description="The first N valid-split words, all played every time.")
    temperature: float = Field(0.0, ge=0)
    early_stopping_patience: int = Field(0, ge=0, description="Stop after N passes without a better win rate; 0 = off.")


class GRPOConfig(StrictModel):
    model: ModelSection = Field(default_factory=ModelSection)
    lora: LoraSection = Field(default_factory=LoraSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    rl: RLSection = Field(default_factory=RLSection)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    reward: RewardWeights = Field(default_factory=RewardWeights)   # per reply by __post_init__, per mode below
    prompts: PromptsSection = Field(default_factory=PromptsSection)
    validation: ValidationSection = Field(default_factory=ValidationSection)
    logs_dir: str = Field("logs", description="Run folders go here (relative to the config file).")
    run_name: str | None = None
    resume: str | None = Field(None, description="Run folder to continue from its latest checkpoint.")
    overwrite: bool = Field(False, description="Replace an existing run folder of the same name.")
    progress: bool = True

    @model_validator(mode="after")
    def _check_train_layers(self) -> "GRPOConfig":
        if self.lora.train_layers is not None and self.model.adapter is None:
            raise ValueError(f"lora.train_layers = {self.lora.train_layers} needs model.adapter (a fresh LoRA "
                             "covers the last lora.num_layers blocks, set that instead)")
        return self

    @model_validator(mode="after")
    def _check_reward_for_mode(self) -> "GRPOConfig":
        try:
            self.reward.check(self.rl.max_turns, self.rl.mode)
        except ValueError as exc:
            raise ValueError(f"reward (rl.mode {self.rl.mode!r}): {exc}") from None
        return self
