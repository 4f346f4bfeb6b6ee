"""How the process runs, whatever the stage: the Linux CPU set-up (OpenBLAS preloaded and glibc malloc tuned by
re-executing once: `blas`), whether MLX has a GPU and so the default dtype (`device`), a clean stop on Ctrl-C or
SIGTERM (`stop_signals`) and progress on stderr (`progress`). Imports no mlx at import time (`device` imports it
when asked) and nothing else of the package but `errors`.
"""
