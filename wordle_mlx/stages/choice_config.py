"""The `data self-play` stage's config (`choice.py`), apart from the stage so that the planner (`stages/plan.py`)
reads it without importing the stage: the model and adapter whose choices label the boards, the secrets played,
how often each distinct example appears, the prompt, an optional fixed opener (checked to be an answer word), and
how a candidate is scored (`decode`).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from ..config import MODEL_SPEC_HELP, StrictModel
from ..game.state import check_guess
from ..game.words import answers
from ..llm.play.prompts import PromptConfig
from ..llm.play.reply_grammar import DecodeMode


class ChoiceConfig(StrictModel):
    model: str = Field("builtin:gemma-3-270m", description=MODEL_SPEC_HELP)
    adapter: str | None = Field(None, description="LoRA adapter folder of the model whose choices label the data.")
    dtype: str | None = Field(None, description="float32, bfloat16 or float16 (default: the model's).")
    out: str = Field("data/self-play", description="Output folder for train.jsonl, valid.jsonl and stats.json.")
    train_games: int | None = Field(None, ge=1, description="Train secrets played (None: the whole train split).")
    valid_games: int | None = Field(None, ge=1, description="Valid secrets played (None: the whole valid split).")
    traffic_cap: int = Field(8, ge=1, description="Each distinct example appears min(traffic, cap) times.")
    retry_fraction: float = Field(0.1, ge=0, le=1, description="Share of distinct examples that also appear once "
                                  "after a made-up invalid reply.")
    prompt: PromptConfig | None = Field(None, description="Prompt settings (None: the adapter's, else the default).")
    opener: str | None = Field(None, description="Label of the empty board, so every game's first guess (an answer "
                               "word); None: the fitting answer the model scores highest, as on every other board.")
    decode: DecodeMode = Field("grammar", description="How a candidate is scored: grammar, the log-probability of "
                               "its 5 letters among the 26 letter tokens (grammar decoding's policy); words, of its 5 "
                               "letters each among the letters that continue an allowed word off the board (words "
                               "decoding's policy); free, of the whole reply over the vocabulary. Prompts with a "
                               "think block or whole-word replies are scored free.")
    score_chunk: int = Field(32, ge=1, description="Candidate replies scored per forward pass.")
    seed: int = Field(0, ge=0, lt=2 ** 32, description="Which secrets are played and the retry examples.")
    progress: bool = Field(True, description="Show progress bars.")

    @field_validator("opener")
    @classmethod
    def _opener_is_an_answer(cls, word: str | None) -> str | None:
        problem = None if word is None else check_guess(word, answers(), "answer list")
        if problem:
            raise ValueError(f"{problem} (the empty board's label must be a fitting answer)")
        return word
