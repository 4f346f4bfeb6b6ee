"""How the process runs, whatever the stage: the Linux CPU set-up (OpenBLAS preloaded and glibc malloc tuned by
re-executing once: `blas`), a clean stop on Ctrl-C or SIGTERM (`stop_signals`) and progress on stderr
(`progress`). Imports neither mlx nor the rest of the package.
"""
