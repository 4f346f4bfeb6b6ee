#!/usr/bin/env bash
# The 270M recipe (scripts/train_270m_cpu.sh, config/recipe-270m/) for Gemma 3 4B on a Mac: the same prompts
# (compact: the clues only), replies (the guess in letters, no think block), stages, losses and step counts:
# data -> three SFT passes on the entropy solver's games (decode "grammar": the 5 letters as choices among 26)
# -> a self-choice round in words decoding (each board the model reaches is labelled with the fitting answer it
# scores highest) -> four SFT passes on it (decode "words") -> a second self-choice round with answer coverage
# (`data cover`) -> one SFT pass -> 100 GRPO steps with plain SGD in words decoding, validated every 20 steps and
# the best kept -> two more coverage rounds (self-play, cover, one SFT pass; the coverage passes also train every
# reply token over the vocabulary, train_free) -> evals -> fuse of the last pass (4-bit: dequantized, the way
# that keeps the adapter) -> the fused model's eval. What differs from the 270M recipe, and
# why: docs/RESULTS.md ("The 4B recipe"). Configs: config/gemma3-4b/ (VARIANT=bf16 for 24 GB and more,
# VARIANT=4bit for 16 GB).
# `wordle-mlx plan --config FILE` prints each training stage's expected peak memory before it runs, with or
# without the model downloaded; `wordle-mlx plan --config FILE --measure` also runs two real steps and projects
# the stage's time on your Mac.
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
trap 'echo "recipe stopped: line $LINENO exited with status $?" >&2' ERR
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

evaluate() {  # evaluate NAME ADAPTER: greedy play of the test words, in the decoding the adapter records
  stage "eval-$1" $W eval --config "$C/eval-$VARIANT.json" --adapter "$2" --no-baselines --games "$GAMES" \
    --max-tokens 16 --out "$R/eval_$1_greedy.json"
}

plan() {  # plan CONFIG: the expected peak memory of its step (known 4B dimensions: no download needed)
  $W plan --config "$1"
}

stage setup      make setup
stage data       $W data --config "$C/data.json"
plan "$C/sft-$VARIANT.json"
stage sft        train_or_resume "logs/gemma3-4b-sft-$VARIANT" $W sft --config "$C/sft-$VARIANT.json"
stage data-focus $W data --config "$C/data-focus.json"
stage sft-focus  train_or_resume "logs/gemma3-4b-sft-focus-$VARIANT" $W sft --config "$C/sft-focus-$VARIANT.json"
stage data-fit   $W data --config "$C/data-fit.json"
stage sft-fit    train_or_resume "logs/gemma3-4b-sft-fit-$VARIANT" $W sft --config "$C/sft-fit-$VARIANT.json"
stage self-play  $W data self-play --config "$C/self-play-$VARIANT.json"
stage sft-choice train_or_resume "logs/gemma3-4b-sft-choice-$VARIANT" $W sft --config "$C/sft-choice-$VARIANT.json"
for n in 2 3 4; do   # three more passes, as the 270M recipe's: each from the one before with a new shuffle seed
  if [ $n = 2 ]; then prev=gemma3-4b-sft-choice-$VARIANT; else prev=gemma3-4b-sft-choice$((n - 1))-$VARIANT; fi
  if [ $n = 2 ]; then size=(--steps 120 --save-every 20); else size=(--steps 240 --save-every 40); fi
  stage sft-choice$n train_or_resume "logs/gemma3-4b-sft-choice$n-$VARIANT" $W sft \
    --config "$C/sft-choice-more-$VARIANT.json" --seed $((n - 1)) --run-name "gemma3-4b-sft-choice$n-$VARIANT" \
    --adapter "logs/$prev/adapters" ${size[@]+"${size[@]}"}
done
stage self-play-2 $W data self-play --config "$C/self-play-2-$VARIANT.json"
stage cover      $W data cover --data "data/gemma3-4b/self-play-2-$VARIANT" --out "data/gemma3-4b/cover-$VARIANT" \
  --max-candidates 5 --copies 4
plan "$C/sft-cover-$VARIANT.json"
stage sft-cover  train_or_resume "logs/gemma3-4b-sft-cover-$VARIANT" $W sft --config "$C/sft-cover-$VARIANT.json"
plan "$C/grpo-$VARIANT.json"
stage grpo       train_or_resume "logs/gemma3-4b-grpo-$VARIANT" $W train --config "$C/grpo-$VARIANT.json"
for n in 2 3; do     # two more coverage rounds, each from the adapter before (GRPO's kept pass for the first)
  stage "self-play-$((n + 1))" $W data self-play --config "$C/self-play-$((n + 1))-$VARIANT.json"
  stage "cover$n" $W data cover --data "data/gemma3-4b/self-play-$((n + 1))-$VARIANT" \
    --out "data/gemma3-4b/cover$n-$VARIANT" --max-candidates 5 --copies 4
  plan "$C/sft-cover-$n-$VARIANT.json"
  stage "sft-cover$n" train_or_resume "logs/gemma3-4b-sft-cover$n-$VARIANT" $W sft \
    --config "$C/sft-cover-$n-$VARIANT.json"
done

evaluate sft       "logs/gemma3-4b-sft-$VARIANT/adapters"
evaluate sftcover  "logs/gemma3-4b-sft-cover-$VARIANT/adapters"
evaluate grpo      "logs/gemma3-4b-grpo-$VARIANT/adapters"
evaluate sftcover3 "logs/gemma3-4b-sft-cover3-$VARIANT/adapters"
# 4-bit: re-quantizing the fused weights rounds away an adapter change below the 4-bit step (fuse refuses such
# a result), so the fused model is written dequantized, in bf16
fuse_flags=()   # expanded as ${a[@]+"${a[@]}"}: bash 3.2 (macOS) stops on an empty "${a[@]}" under set -u
if [ "$VARIANT" = 4bit ]; then fuse_flags=(--dequantize); fi
stage fuse $W fuse --model "$MODEL" --adapter "logs/gemma3-4b-sft-cover3-$VARIANT/adapters" --out "$R/fused" \
  --overwrite ${fuse_flags[@]+"${fuse_flags[@]}"}
# the fused model alone (no adapter), in the same decoding, on the same games
stage eval-fused $W eval --config "$C/eval-$VARIANT.json" --model "$R/fused" --decode words --no-baselines \
  --games "$GAMES" --max-tokens 16 --out "$R/eval_fused_greedy.json"

echo
echo "recipe finished; this invocation took $(( $(date +%s) - start ))s (stage times in seconds: $R/*.done)"
echo "evals: $R/eval_*.json   fused model: $R/fused/"
echo "play:  $W play --model $MODEL --adapter logs/gemma3-4b-sft-cover3-$VARIANT/adapters"
