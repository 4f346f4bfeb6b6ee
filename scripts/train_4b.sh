#!/usr/bin/env bash
# The 270M recipe (scripts/train_270m_cpu.sh) for Gemma 3 4B on a Mac: the same prompts (compact: the clues
# only) and replies (the guess in letters, no think block), the same stages, with fewer SFT passes:
# data -> SFT on the solver's data -> a self-choice round (`data self-play`: each board the model reaches is
# labelled with the fitting answer it scores highest) -> SFT on it -> a second self-choice round -> answer
# coverage (`data cover`) -> one SFT pass on the last 12 of 34 blocks -> GRPO with plain SGD in turn mode -> eval.
# Configs: config/gemma3-4b/ (VARIANT=bf16 for 24 GB and more, VARIANT=4bit for 16 GB; `wordle-mlx plan
# --config FILE` prints each one's expected peak memory). How long a step takes on a given Mac is not measured
# here; the first SFT and GRPO steps print their speed.
#
# Resumable: every finished stage leaves logs/recipe-4b-$VARIANT/<stage>.done and is skipped when the script is
# run again; an interrupted SFT or GRPO stage continues from its last checkpoint (--resume). Ctrl-C stops a
# training stage after its current step with a checkpoint and a non-zero exit, which ends this script.
#
#   scripts/train_4b.sh                     # bf16 (or: make train-4b)
#   VARIANT=4bit scripts/train_4b.sh        # the 4-bit model, for 16 GB Macs
#   GAMES=50 scripts/train_4b.sh            # smaller evals
#   STOP_AFTER=sft scripts/train_4b.sh      # stop after a stage (run again to go on)
#   DRY_RUN=1 scripts/train_4b.sh           # print the stages still to run and their commands
set -euo pipefail
cd "$(dirname "$0")/.."
W="${W:-.venv/bin/wordle-mlx}"
VARIANT="${VARIANT:-bf16}"
case $VARIANT in bf16|4bit) ;; *) echo "VARIANT must be bf16 or 4bit, got '$VARIANT'" >&2; exit 2 ;; esac
C=config/gemma3-4b
R="${R:-logs/recipe-4b-$VARIANT}"
MODEL=mlx-community/gemma-3-4b-it-$VARIANT
GAMES="${GAMES:-200}"
mkdir -p "$R"
start=$(date +%s)

source scripts/recipe_stages.sh   # stage NAME CMD... (run once, .done markers), train_or_resume DIR CMD...

evaluate() {  # evaluate NAME ADAPTER: greedy play of the test words
  stage "eval-$1" $W eval --config "$C/eval-$VARIANT.json" --adapter "$2" --no-baselines --games "$GAMES" \
    --max-tokens 16 --no-progress --out "$R/eval_$1_greedy.json"
}

plan() {  # plan CONFIG: the expected peak memory of its step (needs the model's config.json: after the first download)
  $W plan --config "$1" || echo "(no memory plan yet: the model is downloaded by the first stage that loads it)"
}

stage setup      make setup
stage data       $W data --config "$C/data.json"
plan "$C/sft-$VARIANT.json"
stage sft        train_or_resume "logs/gemma3-4b-sft-$VARIANT" $W sft --config "$C/sft-$VARIANT.json"
stage self-play  $W data self-play --config "$C/self-play-$VARIANT.json" --no-progress
plan "$C/sft-choice-$VARIANT.json"
stage sft-choice train_or_resume "logs/gemma3-4b-sft-choice-$VARIANT" $W sft --config "$C/sft-choice-$VARIANT.json"
stage self-play-2 $W data self-play --config "$C/self-play-2-$VARIANT.json" --no-progress
stage cover      $W data cover --data "data/gemma3-4b/self-play-2-$VARIANT" --out "data/gemma3-4b/cover-$VARIANT" \
  --max-candidates 5 --copies 4 --no-progress
plan "$C/sft-cover-$VARIANT.json"
stage sft-cover  train_or_resume "logs/gemma3-4b-sft-cover-$VARIANT" $W sft --config "$C/sft-cover-$VARIANT.json"
plan "$C/grpo-$VARIANT.json"
stage grpo       train_or_resume "logs/gemma3-4b-grpo-$VARIANT" $W train --config "$C/grpo-$VARIANT.json"

evaluate sft       "logs/gemma3-4b-sft-$VARIANT/adapters"
evaluate sftcover  "logs/gemma3-4b-sft-cover-$VARIANT/adapters"
evaluate grpo      "logs/gemma3-4b-grpo-$VARIANT/adapters"
stage fuse $W fuse --model "$MODEL" --adapter "logs/gemma3-4b-grpo-$VARIANT/adapters" --out "$R/fused" --overwrite

echo
echo "recipe finished; this invocation took $(( $(date +%s) - start ))s (stage times in seconds: $R/*.done)"
echo "evals: $R/eval_*.json   fused model: $R/fused/"
echo "play:  $W play --model $MODEL --adapter logs/gemma3-4b-grpo-$VARIANT/adapters"
