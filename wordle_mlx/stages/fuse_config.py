"""The `fuse` stage's config (`fuse.py`), apart from the stage so that the planner (`stages/plan.py`) reads it
without importing the stage."""

from __future__ import annotations

from pydantic import Field, field_validator

from ..config import StrictModel
from .precision import FUSE_DTYPES, accepted_dtype


class FuseConfig(StrictModel):
    model: str = "builtin:gemma-3-270m"
    adapter: str
    out: str
    dtype: str | None = Field(None, description="float32, bfloat16 or float16 (default: float32 on CPU); the "
                              "vocabulary of `stages/precision.py`.")
    rtol: float = Field(1e-4, ge=0, description="Relative tolerance (to the largest |logit|) of the check, on top "
                        "of the rounding and quantization allowance of `fuse_bounds.logits_limit`.")
    atol: float = Field(1e-4, ge=0)
    dequantize: bool = Field(False, description="Quantized base: write the fused model dequantized (in the base's "
                             "float dtype, or `dtype`) rather than re-quantized.")
    overwrite: bool = False

    @field_validator("dtype")
    @classmethod
    def _fuse_writes(cls, value: str | None) -> str | None:
        return accepted_dtype("fuse", value, FUSE_DTYPES)
