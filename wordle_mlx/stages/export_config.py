"""The `export` stage's config (`export.py`), apart from the stage so that the planner (`stages/plan.py`) reads it
without importing the stage."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, field_validator

from ..config import StrictModel
from .precision import EXPORT_DTYPES, accepted_dtype


class ExportConfig(StrictModel):
    adapter: str
    out: str
    model: Optional[str] = None          # default: the adapter's base_model, else builtin:gemma-3-270m
    dtype: str = Field("float32", description="Matrix storage: float32, float16 or q8 (GGUF's f32, f16, q8_0; norms "
                       "stay float32); the vocabulary of `stages/precision.py`.")
    overwrite: bool = False
    ollama: Optional[bool] = None        # None: a Modelfile when the adapter can play free; True: required
    json_output: bool = False

    @field_validator("dtype")
    @classmethod
    def _export_writes(cls, value: str) -> str:
        return accepted_dtype("export", value, EXPORT_DTYPES)
