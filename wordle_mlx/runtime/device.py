"""Which device MLX computes on, and so which float type a model loads in when the user names none.

`has_gpu()` is the one check for a GPU: any MLX GPU backend alike (Metal on a Mac, CUDA through `mlx[cuda]`),
asked through MLX's public `mx.is_available(mx.gpu)` and the default device, so a process that put MLX on the
CPU counts as CPU. `default_dtype()` is bfloat16 with a GPU and float32 on CPU (half-precision matmuls are far
slower there). The environment variable WORDLE_MLX_DEFAULT_DTYPE (float32, bfloat16 or float16) overrides that
choice, so `WORDLE_MLX_DEFAULT_DTYPE=bfloat16` on Linux loads models as a Mac does; any other value is a
one-line `UserError`. mlx is imported only when a function here is called, as the rest of `runtime` imports none.
"""

from __future__ import annotations

import os

from ..errors import UserError

DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ENV = "WORDLE_MLX_DEFAULT_DTYPE"


def has_gpu() -> bool:
    """True if MLX has a GPU backend (Metal or CUDA) and computes on it by default."""
    import mlx.core as mx

    try:
        return bool(mx.is_available(mx.gpu)) and mx.default_device() == mx.gpu
    except (AttributeError, RuntimeError, ValueError):
        return False


def default_dtype() -> str:
    """WORDLE_MLX_DEFAULT_DTYPE if set, else bfloat16 with a GPU and float32 on CPU."""
    chosen = os.environ.get(DTYPE_ENV, "").strip()
    if chosen:
        if chosen not in DTYPES:
            raise UserError(f"{DTYPE_ENV}={chosen!r}: unknown dtype; use one of {', '.join(DTYPES)}")
        return chosen
    return "bfloat16" if has_gpu() else "float32"
