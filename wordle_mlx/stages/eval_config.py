"""The `eval` stage's config (`evaluate.py`), apart from the stage so that the planner (`stages/plan.py`) reads it
without importing the stage: the model and adapter, how many games of which split, empty or seeded boards, the
rollout settings (`llm/play/rollout.RolloutConfig`, its games decoded 128 at a time), the baselines, the time
limit and where the eval JSON goes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..config import MODEL_SPEC_HELP, StrictModel
from ..llm.play.rollout import RolloutConfig


EVAL_BATCH = 128    # games decoded together: the lockstep letter decoder runs 200 boards 1.2x faster than at 32


class EvalRollout(RolloutConfig):
    """The rollout settings of an eval: as a rollout's, but its games decode `EVAL_BATCH` at a time."""
    completion_batch_size: int = Field(EVAL_BATCH, ge=1, description="Games decoded together per forward step.")


class EvalConfig(StrictModel):
    model: str = Field("builtin:gemma-3-270m", description=MODEL_SPEC_HELP)
    adapter: str | None = Field(None, description="LoRA adapter folder.")
    dtype: str | None = None
    games: int = Field(200, ge=1, description="Play the first N words of the split.")
    split: Literal["test", "valid", "train"] = "test"
    history: Literal["none", "seeded"] = "none"
    seed: int = Field(0, ge=0, lt=2 ** 32)
    rollout: EvalRollout = Field(default_factory=EvalRollout)
    baselines: bool = True
    timeout: float | None = Field(None, gt=0, description="Seconds for the whole eval.")
    out: str | None = None
    json_output: bool = False
    progress: bool = True
