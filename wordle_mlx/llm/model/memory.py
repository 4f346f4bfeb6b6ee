"""Metal memory settings for training on a Mac: a wired limit, a cache limit, and freeing between phases.

On Apple silicon the GPU shares the Mac's memory. `configure_metal_memory()`, called at the start of `sft`
and `train`, sets the wired limit to the device's recommended working set (`mx.set_wired_limit`, as mlx-lm's
generate does), so the model's weights stay resident between steps instead of being paged out, and caps MLX's
cache of freed buffers (`mx.set_cache_limit`) at `CACHE_FRACTION` of that working set: a GRPO step allocates
the rollout's KV caches and then the update's activations, of other shapes, and with the default cap (the
memory limit) both would stay cached. `free_cache()` (`mx.clear_cache`) hands the cache back between a rollout
and its update and after validation. Without Metal (Linux CPU) `configure_metal_memory` does nothing and
returns {}; `free_cache` only empties MLX's CPU buffer cache.
"""

from __future__ import annotations

import mlx.core as mx

from ...runtime import device

CACHE_FRACTION = 0.25     # of the recommended working set


def configure_metal_memory(cache_fraction: float = CACHE_FRACTION) -> dict:
    """Set the wired and cache limits on a GPU that reports a recommended working set (Metal); returns what
    was set, in bytes ({} on CPU, or when the device reports none)."""
    if not device.has_gpu():
        return {}
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
