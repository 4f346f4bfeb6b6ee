"""`wordle-mlx doctor`: what this machine gives MLX.

Reports the platform, the mlx and mlx-lm versions, the default device, whether MLX has a GPU and the dtype
models load in by default (`runtime/device.py`), which BLAS the process has
loaded, and fp32 matmul GFLOP/s for MLX and numpy measured side by side in one run (best of a few
repeats of an N x N matmul). On Linux the CLI re-executes itself with OpenBLAS preloaded first, so
this shows what every other command gets.
"""

from __future__ import annotations

import os
import platform
import time
from importlib import metadata

import mlx.core as mx
import numpy as np

from ..runtime.blas import describe_blas
from ..runtime import device
from ..config import StrictModel
from ..runtime.progress import console


class DoctorConfig(StrictModel):
    size: int = 1024
    repeats: int = 5
    json_output: bool = False


def _best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_gflops(size: int, repeats: int) -> tuple[float, float]:
    flops = 2.0 * size ** 3
    a_np = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    b_np = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
    a_mx, b_mx = mx.array(a_np), mx.array(b_np)
    mx.eval(a_mx, b_mx)
    mlx_s = _best_seconds(lambda: mx.eval(a_mx @ b_mx), repeats)
    np_s = _best_seconds(lambda: a_np @ b_np, repeats)
    return flops / mlx_s / 1e9, flops / np_s / 1e9


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def run(cfg: DoctorConfig) -> dict:
    mlx_gflops, numpy_gflops = matmul_gflops(cfg.size, cfg.repeats)
    result = {
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "mlx_version": mx.__version__,
        "mlx_lm_version": _version("mlx-lm"),
        "device": str(mx.default_device()),
        "gpu": device.has_gpu(),
        "default_dtype": device.default_dtype(),
        "blas": describe_blas(),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "matmul_size": cfg.size,
        "mlx_gflops": round(mlx_gflops, 1),
        "numpy_gflops": round(numpy_gflops, 1),
        "mlx_over_numpy": round(mlx_gflops / numpy_gflops, 3),
    }
    if not cfg.json_output:
        for key, value in result.items():
            console.print(f"{key:>16}: {value}")
        if "reference" in result["blas"]:
            console.print("[yellow]MLX is using the slow reference BLAS: install libopenblas0-pthread (make setup).")
    return result
