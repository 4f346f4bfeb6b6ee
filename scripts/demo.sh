#!/usr/bin/env bash
# `make demo`: the main job, end to end, on the built-in Gemma 3 270M, sized for a 2-core CPU (<= 15 min).
# entropy -> solver -> model import -> data -> SFT -> GRPO -> eval -> plots. Results land in logs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
W=".venv/bin/wordle-mlx"
OUT=logs/demo
mkdir -p "$OUT"
start=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }

step "machine check"
$W doctor

step "entropy precompute (top openers over the 2,315 answers)"
$W entropy --top 5

step "the entropy solver on all 2,315 answers"
$W solve --all --json > "$OUT/solver.json"
$W solve --word abbey

echo
echo "demo finished in $(( $(date +%s) - start ))s; results in $OUT/"
