"""The `sft` stage's config: `SFTConfig` (model, LoRA, data, optimizer and schedule, loss, validation, checkpoints)
and its `game_eval` section, validated in one place (pydantic, extra fields refused), apart from the stage so
that the planner reads it without importing the training loop. `grammar_loss: true`, the old name of
`decode: "grammar"`, still loads.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from ..config import MODEL_SPEC_HELP, LoraConfig, StrictModel
from ..llm.play.reply_grammar import DecodeMode


class GameEvalConfig(StrictModel):
    every: int = Field(0, ge=0, description="Play quick valid-split games every N steps; 0 = off.")
    games: int = Field(8, ge=1, description="The first N valid-split words, all played every time.")
    max_tokens_per_turn: int = Field(16, ge=8, description="Reply length limit (16 fits a letters reply).")


class SFTConfig(StrictModel):
    model: str = Field("builtin:gemma-3-270m", description=MODEL_SPEC_HELP)
    dtype: str | None = Field(None, description="float32, bfloat16 or float16 (default: the model's).")
    data: str = Field("data/sft", description="`wordle-mlx data` output folder (relative to the config file, or "
                      "to the working folder without one).")
    logs_dir: str = Field("logs", description="Run folders go here (relative like data).")
    run_name: str | None = Field("sft", description="Run folder name; None = sft-<date>-<time>.")
    seed: int = Field(0, ge=0, lt=2 ** 32, description="Shuffle order, LoRA init and dropout.")
    lora: LoraConfig = Field(default_factory=LoraConfig)
    start_adapter: str | None = Field(None, description="Start from this adapter folder's LoRA weights (an "
                                      "earlier run's adapters/, like mlx-lm's --resume-adapter-file); its rank "
                                      "and layers must match `lora`. Optimizer and schedule start fresh.")
    steps: int = Field(180, ge=1, description="Optimizer steps.")
    batch_size: int = Field(16, ge=1, description="Examples per micro-batch.")
    grad_accumulation: int = Field(1, ge=1, description="Micro-batches per step.")
    learning_rate: float = Field(1.5e-4, gt=0, description="Peak learning rate (AdamW).")
    warmup_steps: int = Field(20, ge=0, description="Linear warmup steps before the cosine decay.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="The cosine decay ends at learning_rate x this; "
                                "1 = constant.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, ge=0, description="Global gradient-norm clip; 0 = off.")
    max_seq_length: int = Field(256, ge=16, description="Examples are cut to this many tokens.")
    pad_to: int = Field(16, ge=1, description="Pad batch widths and target counts to multiples of this.")
    share_prefix: bool = Field(True, description="Run the start that all examples of a batch share (chat "
                               "markers, system line) once per batch: the same loss, less work.")
    grad_checkpoint: bool = Field(False, description="Recompute activations in the backward pass (less memory).")
    decode: DecodeMode = Field("free", description="The decoding policy the loss trains. free: the full loss, every "
                               "reply token over the vocabulary. grammar: only the reply's 5 letters, each as a choice "
                               "among the 26 letter tokens (grammar decoding's policy; its tags are forced), projected "
                               "on those 26 rows only. words: as grammar, each letter a choice among the letters that "
                               "continue an allowed word not on the example's board (meta.history), words decoding's "
                               "policy. grammar and words need letters-format replies without a think block. "
                               "(grammar_loss true, the old name, means grammar.)")
    train_tags: bool = Field(False, description="With decode grammar or words: also train the reply's other tokens "
                             "(tags and end token, which those decodings force) over the whole vocabulary, so the "
                             "adapter writes them itself and free decoding (Ollama, plain mlx_lm.generate) can play.")
    valid_every: int = Field(60, ge=0, description="Validation loss every N steps (and at the end); 0 = never.")
    valid_batches: int = Field(4, ge=0, description="Validation batches per pass; 0 = all.")
    game_eval: GameEvalConfig = Field(default_factory=GameEvalConfig)
    save_every: int = Field(20, ge=0, description="Checkpoint every N steps (and at the end); 0 = only at the end.")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept (the newest).")
    resume: str | None = Field(None, description="Run folder to continue from its latest checkpoint.")
    overwrite: bool = Field(False, description="Replace an existing run folder of the same name.")
    progress: bool = Field(True, description="Show a progress bar.")

    @model_validator(mode="before")
    @classmethod
    def _old_grammar_loss(cls, data: Any) -> Any:
        """grammar_loss (the old name of decode "grammar") still works: true means decode "grammar"."""
        if isinstance(data, dict) and "grammar_loss" in data:
            data = dict(data)
            old = data.pop("grammar_loss")
            if not isinstance(old, bool):
                raise ValueError(f"grammar_loss: expected true or false, got {old!r} (its new name is decode)")
            if old:
                if data.get("decode", "grammar") != "grammar":
                    raise ValueError(f"grammar_loss true and decode {data['decode']!r}: grammar_loss is the old name "
                                     "of decode 'grammar'; set decode alone")
                data["decode"] = "grammar"
        return data

    @model_validator(mode="after")
    def _check_train_layers(self) -> "SFTConfig":
        if self.lora.train_layers is not None and self.start_adapter is None:
            raise ValueError(f"lora.train_layers = {self.lora.train_layers} needs start_adapter (a fresh LoRA covers "
                             "the last lora.num_layers blocks, set that instead)")
        return self
