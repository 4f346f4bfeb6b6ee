"""`wordle-mlx model import`: write a model as a self-contained mlx-lm folder.

The source is a Gemma 3 `.gguf` file, `builtin:gemma-3-270m` (the bundled GGUF) or `builtin:tiny-random`. GGUF
sources are dequantised to `dtype` (by default float32 on CPU and bfloat16 with a GPU: `runtime/device.py`), or
with `dtype` q8 / q4 have their linear layers re-quantised to 8 or 4 bits (the rest in the default float type);
the folder is built beside `out` and renamed into place, and an existing non-empty `out` is refused. The result
loads with plain `mlx_lm.load(out)` or `--model out`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator

from ..config import StrictModel, resolve_path
from ..errors import UserError
from ..llm.model.gguf_import import bundled_gemma_270m_gguf, import_gguf
from ..llm.model.models import (BUILTIN_PREFIX, BUILTINS, building_dir, check_dtype, describe_model_dir,
                                resolve_model)
from ..llm.model.tiny_model import make_tiny_model_dir
from ..runtime.progress import console
from .precision import IMPORT_DTYPES, QUANT_BITS, accepted_dtype


class ModelImportConfig(StrictModel):
    source: str
    out: Optional[str] = None           # None: import into the user cache (what --model builtin:... uses)
    dtype: Optional[str] = Field(None, description="float32, bfloat16, float16, q8 or q4 (default: float32 on CPU, "
                                 "bfloat16 with a GPU, or WORDLE_MLX_DEFAULT_DTYPE); the vocabulary of "
                                 "`stages/precision.py`.")
    q_group_size: Literal[32, 64, 128] = 64
    json_output: bool = False

    @field_validator("dtype")
    @classmethod
    def _import_writes(cls, value: str | None) -> str | None:
        return accepted_dtype("model import", value, IMPORT_DTYPES)

    @property
    def q_bits(self) -> int | None:
        """8 or 4 for dtype q8 / q4, else None."""
        return QUANT_BITS.get(self.dtype or "")

    @property
    def float_dtype(self) -> str | None:
        """The float type of the weights that stay float (None: the default)."""
        return None if self.q_bits else self.dtype


def import_to_cache(cfg: ModelImportConfig, start: float) -> dict:
    """Import once into the user cache, exactly where `--model SOURCE` looks; a second call is a no-op."""
    if cfg.q_bits is not None:
        raise UserError(f"model import --dtype {cfg.dtype}: needs --out DIR (the cache holds the unquantised import)")
    if not (cfg.source.startswith(BUILTIN_PREFIX) or cfg.source.lower().endswith(".gguf")):
        raise UserError(f"source {cfg.source!r}: expected a .gguf file, builtin:gemma-3-270m or builtin:tiny-random")
    source = cfg.source if cfg.source.startswith(BUILTIN_PREFIX) else str(resolve_path(cfg, cfg.source))
    path = Path(resolve_model(source, cfg.dtype))
    result = {"source": cfg.source, "dtype": check_dtype(cfg.dtype), **describe_model_dir(path),
              "seconds": round(time.perf_counter() - start, 2)}
    if not cfg.json_output:
        console.print(f"model ready in the cache: {result['path']} ({result['size_mb']} MB) in {result['seconds']} s; "
                      f"use it with --model {cfg.source}")
    return result


def run(cfg: ModelImportConfig) -> dict:
    start = time.perf_counter()
    if cfg.out is None:
        return import_to_cache(cfg, start)
    out = resolve_path(cfg, cfg.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"out: {out} already exists and is not an empty folder")
    dtype = check_dtype(cfg.float_dtype)

    if cfg.source == BUILTIN_PREFIX + "tiny-random":
        if cfg.dtype not in (None, "float32"):
            raise UserError(f"model import --dtype {cfg.dtype}: builtin:tiny-random is float32 only; drop --dtype")
        dtype = "float32"
        build = make_tiny_model_dir
    else:
        if cfg.source == BUILTIN_PREFIX + "gemma-3-270m":
            gguf_path = bundled_gemma_270m_gguf()
        elif cfg.source.startswith(BUILTIN_PREFIX):
            raise UserError(f"source {cfg.source!r}: unknown builtin model; known: "
                            + ", ".join(BUILTIN_PREFIX + b for b in BUILTINS))
        else:
            gguf_path = resolve_path(cfg, cfg.source)
            if gguf_path.suffix.lower() != ".gguf":
                raise UserError(f"source {cfg.source!r}: expected a .gguf file or builtin:gemma-3-270m / "
                                "builtin:tiny-random (MLX folders and Hugging Face repos need no import)")
            if not gguf_path.is_file():
                raise UserError(f"source {cfg.source!r}: GGUF file not found")

        def build(folder: Path) -> None:
            import_gguf(gguf_path, folder, dtype=dtype, q_bits=cfg.q_bits, q_group_size=cfg.q_group_size)

    if not cfg.json_output:
        console.print(f"importing {cfg.source} -> {out} ({cfg.dtype or dtype}"
                      + (f": linear layers {cfg.q_bits}-bit, the rest {dtype}" if cfg.q_bits else "") + ")")
    if out.is_dir():
        out.rmdir()  # empty: building_dir renames the finished folder into its place
    with building_dir(out) as tmp:
        build(tmp)
    result = {"source": cfg.source, "dtype": cfg.dtype or dtype, "float_dtype": dtype, **describe_model_dir(out),
              "seconds": round(time.perf_counter() - start, 2)}
    if not cfg.json_output:
        console.print(f"model written to {result['path']} ({result['size_mb']} MB, {len(result['files'])} files) "
                      f"in {result['seconds']} s; use it with --model {result['path']}")
    return result
