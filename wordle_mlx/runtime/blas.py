"""Fast BLAS and memory reuse for MLX on Linux CPU.

The `mlx[cpu]` wheel bundles the reference BLAS, which runs fp32 matmuls far slower than OpenBLAS.
Symbols from a library named in LD_PRELOAD win over the bundled ones, so when we run on
Linux, OpenBLAS is installed and not yet preloaded, the process re-executes itself once with
LD_PRELOAD set. OpenBLAS picks its kernels from the CPU model, and on virtual machines that report a
generic model ("Intel(R) Xeon(R) Processor") it falls back to its oldest x86-64 kernels (Prescott), which
leave the same AVX-512 cores' vector units unused. So the
re-exec also sets OPENBLAS_CORETYPE from the CPU's feature flags (SkylakeX with AVX-512, Haswell with
AVX2 + FMA) unless the user set it. MLX's CPU allocator is plain malloc, and glibc serves every block over 32 MB
(a step's logits, activations and gradients) with a fresh mmap and unmaps it on free, so each training step
has the kernel zero hundreds of MB of new pages again. The re-exec also sets GLIBC_TUNABLES (`MALLOC_TUNABLES`:
no mmap, no trimming, one arena, transparent huge pages) so freed blocks stay in the heap for the next step,
unless the user set GLIBC_TUNABLES (an empty value keeps glibc's defaults). The results are bit for bit the same.
`describe_blas()` reads /proc/self/maps to say which BLAS this process really has. Set WORDLE_MLX_NO_REEXEC=1
to opt out of all of it. numpy's wheel bundles an OpenBLAS of its own (numpy.libs/libscipy_openblas), with its own
threads; where numpy makes small products between MLX's (`cpu_kernels.chunk_attention`) its idle threads spin on
the cores MLX's BLAS needs, and `single_thread_numpy_blas()` keeps it to the calling thread.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
from pathlib import Path
from typing import Callable

OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib64/libopenblasp.so.0",
    "/usr/lib64/libopenblas.so.0",
)
_GUARD = "WORDLE_MLX_BLAS_REEXECED"


def find_openblas() -> str | None:
    """Path of a system OpenBLAS that provides the BLAS symbols, or None."""
    for path in OPENBLAS_CANDIDATES:
        if Path(path).exists():
            return path
    return None


AVX512_FLAGS = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


def openblas_coretype(cpu_flags: set[str] | None = None) -> str | None:
    """The OpenBLAS kernel family these CPU flags support (x86-64 only), or None to let OpenBLAS decide."""
    if cpu_flags is None:
        if platform.machine() not in ("x86_64", "AMD64"):
            return None
        try:
            info = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
        line = next((ln for ln in info.splitlines() if ln.startswith("flags")), "")
        cpu_flags = set(line.partition(":")[2].split())
    if AVX512_FLAGS <= cpu_flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= cpu_flags:
        return "Haswell"
    return None


# glibc's malloc: large blocks from the heap (no mmap), never trimmed back to the system, one arena for all
# threads (MLX's CPU stream allocates and the main thread frees), its pages madvised as transparent huge pages
MALLOC_TUNABLES = ("glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736:glibc.malloc.arena_max=1:"
                   "glibc.malloc.hugetlb=1")


def linux_cpu_env(environ: dict[str, str], openblas: str | None,
                  coretype: Callable[[], str | None]) -> dict[str, str] | None:
    """The environment to re-execute with (OpenBLAS preloaded, its core type, the malloc tunables), or None when
    `environ` already has all of it or opted out. `coretype` is asked only when OpenBLAS gets preloaded."""
    if environ.get("WORDLE_MLX_NO_REEXEC") or environ.get(_GUARD):
        return None
    env = dict(environ)
    preload = env.get("LD_PRELOAD", "")
    if openblas and "openblas" not in preload:
        env["LD_PRELOAD"] = f"{openblas}:{preload}" if preload else openblas
        if not env.get("OPENBLAS_CORETYPE") and (kernels := coretype()):
            env["OPENBLAS_CORETYPE"] = kernels
    if "GLIBC_TUNABLES" not in env:
        env["GLIBC_TUNABLES"] = MALLOC_TUNABLES
    if env == environ:
        return None
    env[_GUARD] = "1"
    return env


def reexec_for_linux_cpu() -> None:
    """Re-execute this process with OpenBLAS preloaded and the malloc tunables set, when that helps. Returns only
    if it does not."""
    if platform.system() != "Linux":       # other C libraries than glibc ignore GLIBC_TUNABLES
        return
    env = linux_cpu_env(dict(os.environ), find_openblas(), openblas_coretype)
    if env is None:
        return
    argv = list(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + argv[1:], env)


def describe_blas() -> str:
    """Which BLAS the loaded libraries come from: 'openblas (preloaded)', 'reference (mlx wheel)', 'accelerate', ..."""
    if platform.system() == "Darwin":
        return "accelerate"
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    # numpy bundles its own OpenBLAS (numpy.libs/...scipy_openblas...); only a system one serves MLX
    libs = {line.split()[-1] for line in maps.splitlines() if "blas" in line and ".libs/" not in line}
    preload = os.environ.get("LD_PRELOAD", "")
    if any("openblas" in lib for lib in libs) and "openblas" in preload:
        return f"openblas (preloaded: {preload.split(':')[0]})"
    if "mlx_cpu.libs" in maps:
        return "reference (bundled with the mlx[cpu] wheel)"
    return ", ".join(sorted(libs)) or "not loaded yet"


_NUMPY_BLAS_THREADS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                       "openblas_set_num_threads")


@functools.cache
def single_thread_numpy_blas() -> bool:
    """Run numpy's own bundled OpenBLAS on the calling thread only (once a process), and say whether it could.
    Its products here are small (a prefill chunk's attention: 128 x 256 x 60), so one thread loses nothing, while
    two spin-wait between calls on the cores MLX's products run on (a 64-board grammar call 3.8-4.3 s against
    2.8-3.1 s). MLX's own BLAS is another library and keeps its threads."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    done = False
    for path in sorted({line.split()[-1] for line in maps.splitlines() if "scipy_openblas" in line}):
        lib = ctypes.CDLL(path)
        name = next((n for n in _NUMPY_BLAS_THREADS if hasattr(lib, n)), None)
        if name is not None:
            getattr(lib, name)(1)
            done = True
    return done
