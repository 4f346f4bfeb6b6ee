#!/usr/bin/env bash
# Install Debian's pthread OpenBLAS so MLX on Linux CPU can use it (wordle_mlx/runtime/blas.py preloads it).
# Does nothing on macOS (MLX uses Accelerate/Metal there). Never fails the build: it says what it could not do.
set -u
[ "$(uname -s)" = "Linux" ] || exit 0
lib=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
[ "$(uname -m)" = "aarch64" ] && lib=/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3
if [ -e "$lib" ]; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "note: apt-get not found; install OpenBLAS yourself for fast MLX on CPU (see README)." >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "note: not root and no passwordless sudo; run 'sudo apt-get install libopenblas0-pthread' for ~30x faster MLX on CPU." >&2
    exit 0
  fi
fi
echo "installing libopenblas0-pthread (MLX's bundled reference BLAS is ~30x slower)..."
$SUDO apt-get update -qq >/dev/null 2>&1 || true
if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1; then
  echo "note: apt-get install libopenblas0-pthread failed; MLX will run on the slow reference BLAS." >&2
fi
exit 0
