"""The `wordle-mlx train` (GRPO) configuration: strict pydantic sections loaded from `config/grpo*.json`.

One section per concern: `model` (base model and an optional SFT adapter to start from), `lora` (the
shared `config.LoraConfig`: layout of fresh LoRA layers), `training` (steps, B prompts per step, optimizer
and schedule, micro-batch sizes, checkpoints), `rl` (episode or turn mode, G, sampling, game rules, prompt
format), `grpo` (clipping, KL, advantages), `reward` (`game/rewards.py` weights, checked against
the mode's invariant when the config is loaded), `prompts` (how the B boards are seeded) and `game_eval`
(valid-split games during training). Defaults are the shipped 270M recipe's last GRPO stage (turn mode, SGD
at 0.02, greedy continuation). Every section forbids unknown keys, so a misspelt field is a one-line error
naming the file and the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..config import MODEL_SPEC_HELP, LoraConfig, StrictModel
from ..game.rewards import RewardWeights
from ..game.seeding import HistoryPolicy
from ..game.state import MAX_GUESSES
from ..llm.play.prompts import PromptConfig
from ..llm.play.reply_grammar import DECODE_HELP, DecodeMode


class ModelSection(StrictModel):
    name: str = Field("builtin:gemma-3-270m", description=MODEL_SPEC_HELP)
    start_adapter: str | None = Field(None, description="SFT adapter folder to start from (relative to the config "
                                      "file); None = a fresh LoRA (`lora`).")
    dtype: str | None = Field(None, description="float32, bfloat16 or float16 (default: the model's).")


class TrainingSection(StrictModel):
    steps: int = Field(8, ge=1, description="Policy updates.")
    batch_prompts: int = Field(8, ge=1, description="B: prompts per step.")
    learning_rate: float = Field(0.02, gt=0, description="Peak learning rate (0.02 suits sgd, about 1e-5 adamw).")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps before the cosine decay.")
    min_lr_ratio: float = Field(1.0, ge=0, le=1, description="The cosine decay ends at learning_rate x this; "
                                "1 = constant.")
    optimizer: Literal["adamw", "sgd"] = Field("sgd", description=(
        "adamw moves every weight by about the learning rate; sgd moves each weight in proportion to its clipped "
        "gradient, so a step's norm is learning_rate x min(grad norm, max_grad_norm). Measured "
        "(docs/RESULTS.md): 8 GRPO steps from a 73 / 200 SFT player won 46 with adamw at 1e-5 and 65 with sgd "
        "at 0.02 (62 with four times the boards a step)."))
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay.")
    max_grad_norm: float = Field(1.0, ge=0, description="Global gradient-norm clip; 0 = off.")
    max_tokens_per_microbatch: int = Field(2048, ge=16, description="Padded tokens per forward/backward pass.")
    max_loss_tokens_per_microbatch: int = Field(256, ge=1, description="Model tokens per pass (vocab-sized logits each).")
    grad_checkpoint: bool = Field(False, description="Recompute each block's activations in the update's backward "
                                  "pass (less memory, about one more forward of compute), as sft's grad_checkpoint.")
    save_every: int = Field(4, ge=0, description="Checkpoint every N steps (and at the end); 0 = only at the end.")
    keep_checkpoints: int = Field(6, ge=1, description="Checkpoints kept (the newest).")
    max_nonfinite_in_a_row: int = Field(3, ge=1, description="Stop after this many non-finite steps in a row.")
    seed: int = Field(0, ge=0, lt=2 ** 32, description="Prompts, LoRA init and sampling.")


class RLSection(StrictModel):
    mode: Literal["episode", "turn"] = Field("turn", description=(
        "'turn': G replies sampled from each board of one game, scored per reply; 'episode': G whole games per "
        "prompt, scored per game."))
    num_generations: int = Field(8, ge=2, description="G: games (episode) or replies (turn) per group.")
    max_completion_tokens: int = Field(16, ge=1, description="Reply length limit (16 fits a letters reply).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollouts.")
    max_invalid_replies: int = Field(3, ge=1, description="A game ends after this many invalid replies.")
    turn_continue: Literal["best", "sampled", "greedy"] = Field(
        "greedy", description="Turn mode: play on with the best-scoring of the G replies, with one sampled reply, or "
        "with the policy's greedy reply (one more decode per turn; the boards are the ones greedy eval reaches).")
    train_greedy: bool = Field(True, description=(
        "Turn mode with turn_continue 'greedy': the greedy reply also joins its group as member G + 1 and is "
        "trained on, so each update pushes the reply greedy play gives up or down. Ignored in episode mode."))
    completion_batch_size: int = Field(64, ge=1, description="Rows per decoding batch.")
    decode: DecodeMode = Field("grammar", description=DECODE_HELP + " The update scores the same policy: in grammar "
                               "and words decoding, the log-softmax over the allowed letters.")
    prompt: PromptConfig = Field(default_factory=PromptConfig, description="Ignored with model.start_adapter "
                                 "unless set: the adapter's recorded prompt applies.")

    @property
    def trains_greedy(self) -> bool:
        """train_greedy where it applies: turn mode with turn_continue 'greedy'."""
        return self.train_greedy and (self.mode, self.turn_continue) == ("turn", "greedy")

    @model_validator(mode="after")
    def _check_train_greedy(self) -> "RLSection":
        if self.mode == "turn" and self.train_greedy and self.turn_continue != "greedy":
            raise ValueError(f"train_greedy needs turn_continue 'greedy', got turn_continue {self.turn_continue!r} "
                             "(set train_greedy false)")
        return self


class PromptsSection(StrictModel):
    k_weights: list[float] = Field([0.7, 0.1, 0.1, 0.1], description="P(k seeded guesses), k = 0, 1, ...")

    @model_validator(mode="after")
    def _check(self) -> "PromptsSection":
        HistoryPolicy(tuple(self.k_weights))
        return self


class GRPOSection(StrictModel):
    beta: float = Field(0.0, ge=0, description="KL weight to the reference policy, the model with LoRA switched off.")
    advantage: Literal["normalized", "centered"] = Field("normalized", description=(
        "'normalized': GRPO, (r - mean) / std within a group; 'centered': r - mean (Dr. GRPO)."))


class GameEvalSection(StrictModel):
    every: int = Field(0, ge=0, description="Play the valid-split games greedily, in the run's decoding, before the "
                       "first step (the start adapter, as step 0), every N steps and at the end; 0 = never. The "
                       "adapter with the most wins is kept in adapters_best/.")
    games: int = Field(20, ge=1, description="The first N valid-split words, all played every time.")
    keep: Literal["last", "best"] = Field("last", description="The run's adapters/ at the end: the last step's, or "
                                          "the best validation step's (adapters_best/, the earliest on a tie; the "
                                          "start adapter when no step beat it). Needs every > 0 for best.")

    @model_validator(mode="after")
    def _check_keep(self) -> "GameEvalSection":
        if self.keep == "best" and not self.every:
            raise ValueError("keep 'best' needs every > 0 (validation picks the best adapter)")
        return self


class GRPOConfig(StrictModel):
    model: ModelSection = Field(default_factory=ModelSection)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    training: TrainingSection = Field(default_factory=TrainingSection)
    rl: RLSection = Field(default_factory=RLSection)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    reward: RewardWeights = Field(default_factory=lambda: RewardWeights(  # checked per reply and per mode below
        early=4.5, valid=0.3, consistent=0.3, info_gain=0.1, repeat=0.35))
    prompts: PromptsSection = Field(default_factory=PromptsSection)
    game_eval: GameEvalSection = Field(default_factory=GameEvalSection)
    logs_dir: str = Field("logs", description="Run folders go here (relative to the config file).")
    run_name: str | None = Field("grpo", description="Run folder name; None = grpo-<date>-<time>.")
    resume: str | None = Field(None, description="Run folder to continue from its latest checkpoint.")
    overwrite: bool = Field(False, description="Replace an existing run folder of the same name.")
    progress: bool = Field(True, description="Show a progress bar.")

    @model_validator(mode="after")
    def _check_train_layers(self) -> "GRPOConfig":
        if self.lora.train_layers is not None and self.model.start_adapter is None:
            raise ValueError(f"lora.train_layers = {self.lora.train_layers} needs model.start_adapter (a fresh LoRA "
                             "covers the last lora.num_layers blocks, set that instead)")
        return self

    @model_validator(mode="after")
    def _check_reward_for_mode(self) -> "GRPOConfig":
        try:
            self.reward.check(MAX_GUESSES, self.rl.mode)
        except ValueError as exc:
            raise ValueError(f"reward (rl.mode {self.rl.mode!r}): {exc}") from None
        return self
