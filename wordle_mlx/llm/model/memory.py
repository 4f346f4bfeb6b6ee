"""Memory settings for training: on a Mac a wired limit and a cache limit, on the CPU a cache limit, and freeing
between phases.

On Apple silicon the GPU shares the Mac's memory. `configure_memory()`, called at the start of `sft`
and `train`, sets the wired limit to the device's recommended working set (`mx.set_wired_limit`, as mlx-lm's
generate does), so the model's weights stay resident between steps instead of being paged out, and caps MLX's
cache of freed buffers (`mx.set_cache_limit`) at `CACHE_FRACTION` of that working set: a GRPO step allocates
the rollout's KV caches and then the update's activations, of other shapes, and with the default cap (the
memory limit) both would stay cached. `free_cache()` (`mx.clear_cache`) hands the cache back between a rollout
and its update and after validation. Without Metal (Linux CPU) it sets only the cache limit, at `CACHE_FRACTION`
of the physical memory: MLX's CPU default keeps 32 MB of freed buffers, so each training step handed its large
buffers (a `train_free` batch's 208 x 262k logits and their gradient, 218 MB each) back to the system and took
fresh pages for them, a page fault apiece, the next step (`benchmarks/cpu_kernels.py`: a `train_free` step 1.45x
faster with these and the cross-entropy's numpy buffers kept). `free_cache` empties the cache on either device.
"""

from __future__ import annotations

import os

import mlx.core as mx

from . import models

CACHE_FRACTION = 0.25     # of the recommended working set (Metal) or of the physical memory (CPU)


def physical_memory() -> int | None:
    """The machine's physical memory in bytes, where the OS says (Linux, macOS), else None."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def configure_memory(cache_fraction: float = CACHE_FRACTION) -> dict:
    """Set the wired and cache limits on Metal, the cache limit on the CPU; returns what was set, in bytes."""
    if not models.metal_available():
        total = physical_memory()
        if not total:
            return {}
        settings = {"cache_limit_bytes": int(cache_fraction * total)}
        mx.set_cache_limit(settings["cache_limit_bytes"])
        return settings
    working_set = mx.device_info().get("max_recommended_working_set_size")
    if not working_set:
        return {}
    settings = {"cache_limit_bytes": int(cache_fraction * working_set)}
    mx.set_cache_limit(settings["cache_limit_bytes"])
    try:
        mx.set_wired_limit(int(working_set))
        settings["wired_limit_bytes"] = int(working_set)
    except (ValueError, RuntimeError):      # above the system's wired limit (sysctl iogpu.wired_limit_mb)
        pass
    return settings


def free_cache() -> None:
    """Return MLX's cached free buffers to the system (between a rollout and its update, after validation)."""
    mx.clear_cache()
