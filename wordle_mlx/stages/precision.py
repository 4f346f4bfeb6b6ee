"""One vocabulary for the precision a model is written in: `fuse`, `export` and `model import` take `--dtype`.

The values are `float32`, `bfloat16`, `float16` (every weight in that float type), `q8` and `q4` (linear layers
stored as 8- or 4-bit integers with per-group scales, the rest in a float type). Each command accepts the subset it
can write (`FUSE_DTYPES`, `EXPORT_DTYPES`, `IMPORT_DTYPES`); `accepted_dtype` is the config validator that refuses
any other value with one line naming the command, the value and what it accepts. `GGUF_TYPES` maps export's values
to GGUF's own tensor type names, and `QUANT_BITS` the quantized values to their bit widths.
"""

from __future__ import annotations

from typing import Sequence

from ..runtime.device import DTYPES as FLOAT_DTYPES

DTYPES = FLOAT_DTYPES + ("q8", "q4")
FUSE_DTYPES = FLOAT_DTYPES
EXPORT_DTYPES = ("float32", "float16", "q8")
IMPORT_DTYPES = DTYPES
GGUF_TYPES = {"float32": "f32", "float16": "f16", "q8": "q8_0"}
QUANT_BITS = {"q8": 8, "q4": 4}


def accepted_dtype(command: str, value: str | None, accepted: Sequence[str]) -> str | None:
    """`value` when `command` can write it (None passes: the command's default); else a ValueError, which the
    config loader turns into one line."""
    if value is None or value in accepted:
        return value
    raise ValueError(f"{command} --dtype {value!r}: {command} writes {', '.join(accepted)}")
