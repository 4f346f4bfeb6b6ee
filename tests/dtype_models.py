"""The tiny random model in the Mac dtypes, for the bf16 and 4-bit tests: a bfloat16 copy and a 4-bit copy
made by mlx-lm's own converter (`mlx_lm.convert`, as `mlx-community/*-4bit` repos are made), each built once
per process in a temporary folder."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_built: dict[str, Path] = {}


def tiny_model_in(kind: str) -> str:
    """A model folder of `builtin:tiny-random` saved as "bfloat16" or quantized to "4bit" (mlx-lm's default group size 64)."""
    if kind not in _built:
        from mlx_lm.convert import convert

        from wordle_mlx.llm.models import tiny_random_dir

        root = Path(tempfile.mkdtemp(prefix="wordle-mlx-dtypes-"))
        atexit.register(shutil.rmtree, root, True)
        out = root / kind
        if kind == "bfloat16":
            convert(str(tiny_random_dir()), str(out), dtype="bfloat16")
        elif kind == "4bit":
            convert(str(tiny_random_dir()), str(out), quantize=True, q_bits=4, dtype="bfloat16")
        else:
            raise ValueError(f"unknown kind {kind!r}")
        _built[kind] = out
    return str(_built[kind])
