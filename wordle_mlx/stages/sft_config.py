"""The `sft` stage's config: the shared training shape (`train_config.py`) plus `data` (the examples and how they
are batched) and `train_free`, validated in one place and apart from the stage, so that the planner reads it
without importing the training loop. `decode` picks the loss: the full loss over the vocabulary (free), the
reply's letters as choices among the 26 letter tokens (grammar), or among the letters that continue an allowed
word not on the example's board (words).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from ..config import StrictModel
from ..llm.play.reply_grammar import DecodeMode
from .train_config import OptimizerSection, RunSection, TrainConfig, ValidationSection


class SFTData(StrictModel):
    folder: str = Field("data/sft", description="`wordle-mlx data` output folder (relative to the config file, or "
                        "to the working folder without one).")
    batch_size: int = Field(16, ge=1, description="Examples per step.")
    max_seq_length: int = Field(256, ge=16, description="Examples are cut to this many tokens.")
    pad_to: int = Field(16, ge=1, description="Pad batch widths and target counts to multiples of this.")


class SFTValidation(ValidationSection):
    every: int = Field(60, ge=0, description="Validation loss (and `games` games) every N steps and at the end; "
                       "0 = never.")
    batches: int = Field(4, ge=0, description="Validation batches per pass, spread over the lengths; 0 = all.")


class SFTOptimizer(OptimizerSection):
    learning_rate: float = Field(1.5e-4, gt=0, description="Peak learning rate.")
    warmup_steps: int = Field(20, ge=0, description="Linear warmup from learning_rate / (warmup_steps + 1) over "
                              "this many steps, then the cosine decay.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="The cosine decay ends at learning_rate x this; "
                                "1 = constant.")


class SFTRun(RunSection):
    name: str | None = Field("sft", description="Run folder name under logs_dir; None = sft-<date>-<time>.")
    steps: int = Field(180, ge=1, description="Optimizer steps.")


class SFTConfig(TrainConfig):
    STAGE: ClassVar[str] = "sft"
    optimizer: SFTOptimizer = Field(default_factory=SFTOptimizer)
    run: SFTRun = Field(default_factory=SFTRun)
    decode: DecodeMode = Field("free", description=(
        "The decoding policy the loss trains. free: every reply token over the vocabulary. grammar: only the "
        "reply's 5 letters, each a choice among the 26 letter tokens (the tags are forced). words: as grammar, each "
        "letter a choice among those that continue an allowed word not on the example's board (meta.history). "
        "grammar and words need letters-format replies without a think block."))
    validation: SFTValidation = Field(default_factory=SFTValidation)
    data: SFTData = Field(default_factory=SFTData)
    train_free: bool = Field(False, description="With decode grammar or words: also train every reply token "
                             "(letters, and the tags and end token those decodings force) over the whole vocabulary, "
                             "added to the letters' loss, so that free decoding (Ollama, plain mlx_lm.generate) "
                             "can play the adapter.")
