"""The config shape that `wordle-mlx sft` and `wordle-mlx train` (GRPO) share, validated in one place.

Both stages train a LoRA adapter with the same loop (`llm/training/trainer.py`), so both configs have the same
sections under the same names: `model` (base model, dtype, the adapter to start from, gradient checkpointing),
`lora` (mlx-lm's LoRA layout), `optimizer` (optimizer, learning rate and its warmup-then-cosine schedule,
gradient clip), `run` (run folder, steps, seed, checkpoints, resume, overwrite, progress, reporting), `decode` and
`max_tokens` (the decoding policy and the reply length) and `validation`. SFT adds `data` and `train_free`
(`sft_config.py`), GRPO adds `rl` and `reward` (`grpo_config.py`). Every section forbids unknown keys, so a field
of an older shape is a one-line error naming the file, the field and the value (the README lists the renames).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from ..config import MODEL_SPEC_HELP, StrictModel
from ..errors import UserError
from ..storage.reporting import parse_report_to
from ..llm.play.reply_grammar import DECODE_HELP, DecodeMode

REPORT_TO_HELP = ("Also send the metrics to tensorboard and/or wandb (comma-separated, as mlx-lm's --report-to); "
                  "metrics.jsonl is written either way.")


class ModelSection(StrictModel):
    name: str = Field("builtin:gemma-3-270m", description=MODEL_SPEC_HELP)
    dtype: str | None = Field(None, description="float32, bfloat16 or float16 (default: the model's; float32 on CPU).")
    adapter: str | None = Field(None, description="Start from this adapter folder (an earlier run's adapters/, "
                                "relative to the config file): its LoRA layout and weights; the optimizer and "
                                "schedule start fresh. None = a fresh LoRA (`lora`).")
    grad_checkpoint: bool = Field(False, description="Recompute each block's activations in the backward pass (less "
                                  "memory, about one more forward pass of compute).")


class LoraConfig(StrictModel):
    """The layout of fresh LoRA layers (mlx-lm's). With `model.adapter` the adapter's own rank, scale and layers
    apply; dropout and train_layers still do."""
    rank: int = Field(16, ge=1, description="LoRA rank r.")
    scale: float = Field(20.0, gt=0, description="mlx-lm's LoRA scale (the update is scale * B A x).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA input while training.")
    num_layers: int = Field(-1, ge=-1, description="Adapt the last N blocks; -1 = all.")
    train_layers: int | None = Field(None, ge=1, description="With model.adapter: only the LoRA weights of the last "
                                     "N blocks train, the others keep the adapter's values (None: all train).")


class OptimizerSection(StrictModel):
    name: Literal["adamw", "sgd"] = Field("adamw", description="adamw moves every weight by about the learning rate; "
                                          "sgd moves each weight in proportion to its clipped gradient.")
    learning_rate: float = Field(1.5e-4, gt=0, description="Peak learning rate.")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup from learning_rate / (warmup_steps + 1) over this "
                              "many steps, then the cosine decay.")
    min_lr_ratio: float = Field(1.0, ge=0, le=1, description="The cosine decay ends at learning_rate x this; "
                                "1 = constant.")
    max_grad_norm: float = Field(1.0, ge=0, description="Global gradient-norm clip; 0 = off.")


class RunSection(StrictModel):
    name: str | None = Field(None, description="Run folder name under logs_dir; None = <stage>-<date>-<time>.")
    logs_dir: str = Field("logs", description="Run folders go here (relative to the config file, or to the working "
                          "folder without one).")
    steps: int = Field(100, ge=1, description="Optimizer steps.")
    seed: int = Field(0, ge=0, lt=2 ** 32, description="Data order or prompts, LoRA init, dropout and sampling.")
    save_every: int = Field(20, ge=0, description="Checkpoint every N steps (and at the end); 0 = only at the end.")
    resume: str | None = Field(None, description="Run folder to continue from its latest checkpoint.")
    overwrite: bool = Field(False, description="Replace an existing run folder of the same name.")
    progress: bool = Field(True, description="Show a progress bar.")
    report_to: str = Field("", description=REPORT_TO_HELP)

    @field_validator("report_to")
    @classmethod
    def _check_report_to(cls, value: str) -> str:
        """Known names whose package is installed, checked before a run touches its folder."""
        try:
            return ",".join(parse_report_to(value))
        except UserError as exc:
            raise ValueError(str(exc).removeprefix("--report-to ")) from None


class ValidationSection(StrictModel):
    every: int = Field(0, ge=0, description="Validate every N steps and at the end; 0 = never.")
    games: int = Field(0, ge=0, description="Play the first N valid-split words greedily, in the run's decoding, "
                       "at each validation.")


class TrainConfig(StrictModel):
    """What SFT and GRPO configs share; `STAGE` names the stage."""
    STAGE: ClassVar[str] = "train"
    model: ModelSection = Field(default_factory=ModelSection)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    run: RunSection = Field(default_factory=RunSection)
    decode: DecodeMode = Field("grammar", description=DECODE_HELP)
    max_tokens: int = Field(16, ge=1, description="Reply length limit in free decoding (16 fits a letters reply).")
    validation: ValidationSection = Field(default_factory=ValidationSection)

    @model_validator(mode="after")
    def _check_train_layers(self) -> "TrainConfig":
        if self.lora.train_layers is not None and self.model.adapter is None:
            raise ValueError(f"lora.train_layers = {self.lora.train_layers} needs model.adapter (a fresh LoRA covers "
                             "the last lora.num_layers blocks, set that instead)")
        return self

