"""The `eval` stage's config (`evaluate.py`), apart from the stage so that the planner (`stages/plan.py`) reads it
without importing the stage: the model and adapter, how many games of which split, empty or seeded boards, the
rollout settings (`llm/play/rollout.RolloutConfig`), the baselines, the time limit and where the eval JSON goes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..config import MODEL_SPEC_HELP, StrictModel
from ..llm.play.rollout import RolloutConfig


class EvalConfig(StrictModel):
    model: str = Field("builtin:gemma-3-270m", description=MODEL_SPEC_HELP)
    adapter: str | None = Field(None, description="LoRA adapter folder.")
    dtype: str | None = None
    games: int = Field(200, ge=1, description="Play the first N words of the split.")
    split: Literal["test", "valid", "train"] = "test"
    history: Literal["none", "seeded"] = "none"
    seed: int = Field(0, ge=0, lt=2 ** 32)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    baselines: bool = True
    timeout: float | None = Field(None, gt=0, description="Seconds for the whole eval.")
    out: str | None = None
    json_output: bool = False
    progress: bool = True
