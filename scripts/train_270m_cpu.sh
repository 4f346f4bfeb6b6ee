#!/usr/bin/env bash
# The real run on this 2-core CPU: builtin:gemma-3-270m through entropy -> data -> three SFT passes on the entropy
# solver's games -> a self-choice round (the model labels each board it reaches with the fitting answer it scores
# highest) -> four SFT passes on it -> three coverage rounds (self-play with answer coverage, one SFT pass each),
# with 100 GRPO steps after the first -> evals -> plots -> the last pass's adapter packaged in
# adapters/gemma-3-270m-wordle/, if it wins at least as many greedy test games as the adapter there (the ship
# guard). Prompts are compact (the clues only) and replies spell the guess in letters with no think block
# (config/recipe-270m/data.json).
#
# The policy it trains is words decoding, the game's own rule: at each letter the model's distribution over the
# letters that continue an allowed word not already on the board. The three teacher passes train the letters as
# choices among all 26 (decode "grammar": the spelling free decoding needs too); self-play labels, the later SFT
# passes (decode "words") and GRPO (100 steps, decode "words", validated on the 100 validation words every 20
# steps from the SFT start as step 0, the best kept) all use words decoding. The last two coverage rounds are the
# ones that trained the shipped adapter from its start (docs/RESULTS.md, "The shipped adapter"); the three coverage
# SFT passes also train every reply token over the whole vocabulary (train_free), as those rounds did, so that
# --decode free plays (it adds about 1.4 s to a step, 17 min to the recipe). Each adapter records its decoding (adapter_config.json), and eval plays it by default.
#
# Time, measured in one whole run on a 2-core AVX-512 host (docs/RESULTS.md, "The recipe"): 2 h 15 min of
# training (the SFT passes 4-15 min each, the coverage passes with train_free 13-15 min; GRPO's 100 steps with
# their 6 validation passes 25 min; each self-play round 3-4 min), then about 45 min of evals (16 of 200 games,
# the shipped adapter's two for the guard). On a slower 2-core AVX-512 host the stages up to GRPO took 1.26x as
# long (about 2 h 51 min of training projected), on a 2-core AVX2 host 2.2-2.8x.
# What makes it fast: every SFT pass trains only the reply's 5 letters as choices among the 26 letter tokens
# (no 262k-entry softmax; the last pass adds it for its whole reply), every pass after the first trains only the
# last 6 blocks' LoRA (the backward pass stops there), self-play scores candidates on the 26 letter rows, and
# GRPO and the evals decode letters on those rows.
#
# Resumable: every finished stage leaves logs/recipe-270m/<stage>.done and is skipped when the script is
# run again; an interrupted SFT or GRPO stage continues from its last checkpoint (--resume). Ctrl-C or SIGTERM
# (a shutdown) stops a training stage after its current step with a checkpoint and a non-zero exit, which
# ends this script; a crash or a power cut costs at most the steps since the last checkpoint. To start over:
# rm -r logs/recipe-270m logs/sft-270m logs/sft-focus-270m logs/sft-fit-270m data/choice \
#   logs/sft-choice*-270m data/choice[234] data/choice[234]-cover5c4 logs/sft-cover*-270m \
#   logs/grpo-cover-270m
#
#   scripts/train_270m_cpu.sh                  # everything (or: make train-270m)
#   GAMES=50 scripts/train_270m_cpu.sh         # smaller evals
#   EVALS=greedy scripts/train_270m_cpu.sh     # only the greedy evals (default: greedy free seeded)
#   STOP_AFTER=sft-fit scripts/train_270m_cpu.sh  # stop after a stage (run again to go on)
#   DRY_RUN=1 scripts/train_270m_cpu.sh        # print the stages still to run and their commands
set -euo pipefail
trap 'echo "recipe stopped: line $LINENO exited with status $?" >&2' ERR
cd "$(dirname "$0")/.."
W="${W:-.venv/bin/wordle-mlx}"
R="${R:-logs/recipe-270m}"   # the stage markers (<stage>.done, holding its seconds)
GAMES="${GAMES:-200}"
EVALS="${EVALS:-greedy free seeded}"
DECODE=words                 # the decoding the recipe trains (its adapters record it; the ship guard compares in it)
SHIP=adapters/gemma-3-270m-wordle
mkdir -p "$R"
start=$(date +%s)

source scripts/recipe_stages.sh   # stage NAME CMD... (run once, .done markers), train_or_resume DIR CMD...

evaluate() {  # evaluate NAME ADAPTER|- KIND: one held-out setting for one player
  local name=$1 adapter=$2 kind=$3 extra=() out
  # the base model plays the adapters' prompts (an adapter brings its own: adapter_config.json)
  if [ "$adapter" != "-" ]; then extra=(--adapter "$adapter" --no-baselines); else extra=(--config config/recipe-270m/eval.json); fi
  # 16 tokens per reply: a letters reply is 11 ('<guess> c r a n e</guess>'); the base model never closes a tag.
  extra+=(--games "$GAMES" --max-tokens 16)
  # greedy, sampled and seeded play the decoding the adapter records (words for this recipe's adapters; the
  # base model and adapters without a record: grammar); free and words set it
  case $kind in
    greedy)  out=greedy ;;
    sampled) out=t07;          extra+=(--temperature 0.7 --seed 0) ;;
    seeded)  out=seeded;       extra+=(--history seeded) ;;
    free)    out=greedy_free;  extra+=(--decode free) ;;
    words)   out=greedy_words; extra+=(--decode words) ;;
    *) echo "unknown eval kind '$kind' in EVALS (greedy sampled seeded free words)" >&2; exit 2 ;;
  esac
  # ${a[@]+"${a[@]}"}: bash 3.2 (macOS) stops on an empty "${a[@]}" under set -u
  stage "eval-$name-$kind" $W eval ${extra[@]+"${extra[@]}"} --out "$R/eval_${name}_$out.json"
}

stage setup   make setup
stage model   $W model import builtin:gemma-3-270m
stage entropy $W entropy --top 5
stage data    $W data --config config/recipe-270m/data.json
# SFT 1 on the broad data (boards seeded with 0-4 earlier guesses of several kinds); the three teacher passes
# train the reply's 5 letters as choices among the 26 (decode "grammar").
stage sft     train_or_resume logs/sft-270m $W sft --config config/recipe-270m/sft.json
# SFT 2 (focus): from SFT 1's adapter, on data that adds every board of the teacher's games from the empty board
# over the train secrets (3 copies each) to 1,500 broad examples. From here on only the last 6 blocks' LoRA trains.
stage data-focus $W data --config config/recipe-270m/data-focus.json
stage sft-focus  train_or_resume logs/sft-focus-270m $W sft --config config/recipe-270m/sft-focus.json
# SFT 3 (fit): from SFT 2's adapter at lr 3e-5, on the teacher's boards only, each as often as the train games
# pass through it, capped at 16.
stage data-fit   $W data --config config/recipe-270m/data-fit.json
stage sft-fit    train_or_resume logs/sft-fit-270m $W sft --config config/recipe-270m/sft-fit.json
# The self-play round: the fit adapter plays every train secret from the empty board; each board it reaches is
# labelled with the answer that fits the clues which the model itself scores highest, in words decoding. From
# here on every SFT pass trains words decoding's policy (decode "words").
stage choice     $W data self-play --config config/recipe-270m/self-play.json
# SFT on that data from the fit adapter (lr 3e-5), then three more passes at a constant 1.5e-5, each from the
# one before with a new shuffle seed.
stage sft-choice train_or_resume logs/sft-choice-270m $W sft --config config/recipe-270m/sft-choice.json
# The passes share config/recipe-270m/sft-choice-more.json; each gets its seed, run name and start adapter here
# (--seed, --run-name, --adapter: run.seed, run.name and model.adapter)
# (pass 2 is half as long, with a checkpoint every 20 steps).
more=()      # the passes' flags, also recorded by the ship stage
for n in 2 3 4; do
  if [ $n = 2 ]; then prev=sft-choice-270m; else prev=sft-choice$((n - 1))-270m; fi
  if [ $n = 2 ]; then size=(--steps 120 --save-every 20); else size=(--steps 240 --save-every 40); fi
  flags=(--seed $((n - 1)) --run-name sft-choice$n-270m --adapter logs/$prev/adapters ${size[@]+"${size[@]}"})
  more+=(${flags[*]+"${flags[*]}"})
  stage sft-choice$n train_or_resume logs/sft-choice$n-270m $W sft --config config/recipe-270m/sft-choice-more.json \
    ${flags[@]+"${flags[@]}"}
done
# The first coverage round: a second self-play round from that adapter; every answer that fits some tight board
# of it (at most 5 answers left) is added as a label there, 4 times (`data cover`); one SFT pass on it, then 100
# GRPO steps with plain SGD in words decoding, playing full games on from the greedy reply; the 100 validation words are played every 20 steps (the SFT start as step 0) and the run's
# adapters/ are the pass with the most wins (validation keeps the best: the SFT start when no step beats it).
stage choice2    $W data self-play --config config/recipe-270m/self-play-2.json
stage cover      $W data cover --data data/choice2 --out data/choice2-cover5c4 --max-candidates 5 --copies 4
stage sft-cover  train_or_resume logs/sft-cover-270m $W sft --config config/recipe-270m/sft-cover.json
stage grpo-cover train_or_resume logs/grpo-cover-270m $W train --config config/recipe-270m/grpo-cover.json
# Two more coverage rounds, as the shipped adapter's last rounds ran: self-play from the adapter before (GRPO's
# kept pass for the first), cover, one SFT pass (with train_free, like the first); the last pass's adapter is the
# one the recipe ships.
for n in 2 3; do
  stage choice$((n + 1)) $W data self-play --config config/recipe-270m/self-play-$((n + 1)).json
  stage cover$n $W data cover --data data/choice$((n + 1)) --out data/choice$((n + 1))-cover5c4 --max-candidates 5 \
    --copies 4
  stage sft-cover$n train_or_resume logs/sft-cover$n-270m $W sft --config config/recipe-270m/sft-cover-$n.json
done

evaluate base - greedy
evaluate sft1 logs/sft-270m/adapters greedy
evaluate sft2 logs/sft-focus-270m/adapters greedy
evaluate fit logs/sft-fit-270m/adapters greedy
evaluate sftchoice logs/sft-choice4-270m/adapters greedy
for kind in $EVALS; do       # every player's greedy eval first, then the next setting
  # free decoding: only the adapter the recipe ships (the others: eval --decode free by hand)
  if [ "$kind" != free ]; then
    evaluate sftcover  logs/sft-cover-270m/adapters "$kind"
    evaluate grpocover logs/grpo-cover-270m/adapters "$kind"
    evaluate sftcover2 logs/sft-cover2-270m/adapters "$kind"
  fi
  evaluate sftcover3 logs/sft-cover3-270m/adapters "$kind"
done

# The ship guard: the adapter in $SHIP plays the same greedy test games in the recipe's decoding and in free
# decoding (what llama.cpp and Ollama play), and the new one ships only if it wins at least as many in both (else
# the ship stage says why and leaves $SHIP as it was).
guard=()
# the guard needs the new adapter's greedy evals in both decodings, whatever EVALS says
case " $EVALS " in *" greedy "*) ;; *) evaluate sftcover3 logs/sft-cover3-270m/adapters greedy ;; esac
case " $EVALS " in *" free "*) ;; *) evaluate sftcover3 logs/sft-cover3-270m/adapters free ;; esac
if [ -f "$SHIP/adapters.safetensors" ]; then
  for mode in $DECODE free; do
    stage eval-shipped-$mode $W eval --adapter "$SHIP" --no-baselines --games "$GAMES" --max-tokens 16 \
      --decode $mode --out "$R/eval_shipped_greedy_$mode.json"
  done
  guard=(--guard "$R/eval_sftcover3_greedy.json" "$R/eval_shipped_greedy_$DECODE.json"
         --guard "$R/eval_sftcover3_greedy_free.json" "$R/eval_shipped_greedy_free.json")
fi
stage plots bash -c "
  $W plot --file logs/sft-270m/metrics.jsonl --out $R/plots/sft1 &&
  $W plot --file logs/sft-fit-270m/metrics.jsonl --out $R/plots/fit &&
  $W plot --file logs/sft-cover3-270m/metrics.jsonl --out $R/plots/sft &&
  $W plot --file logs/grpo-cover-270m/metrics.jsonl --out $R/plots/grpo &&
  $W plot --compare $R/eval_base_greedy.json $R/eval_sft1_greedy.json $R/eval_sft2_greedy.json \
      $R/eval_fit_greedy.json $R/eval_sftchoice_greedy.json $R/eval_sftcover_greedy.json $R/eval_grpocover_greedy.json \
      $R/eval_sftcover2_greedy.json $R/eval_sftcover3_greedy.json \
      --labels base sft-1 sft-2 sft-fit sft-choice sft-cover sft-cover+grpo sft-cover-2 sft-cover-3 \
      --with-baselines --out $R/plots/compare"

ship_evals=()     # the shipped adapter's evals, and GRPO's and its SFT start's, so the comparisons can be replayed
for f in "$R"/eval_sftcover3_*.json "$R"/eval_grpocover_*.json "$R"/eval_sftcover_*.json; do
  ship_evals+=(--eval "$f")
done
sft_configs=()
for c in sft sft-focus sft-fit sft-choice; do sft_configs+=(--sft-config "config/recipe-270m/$c.json"); done
for flags in ${more[@]+"${more[@]}"}; do sft_configs+=(--sft-config "config/recipe-270m/sft-choice-more.json $flags"); done
for c in sft-cover sft-cover-2 sft-cover-3; do sft_configs+=(--sft-config "config/recipe-270m/$c.json"); done
stage ship .venv/bin/python scripts/ship_adapter.py --adapter logs/sft-cover3-270m/adapters --out "$SHIP" \
  --data-config config/recipe-270m/data.json --data-config config/recipe-270m/data-focus.json --data-config config/recipe-270m/data-fit.json \
  --choice-config config/recipe-270m/self-play.json --choice-config config/recipe-270m/self-play-2.json \
  --choice-config config/recipe-270m/self-play-3.json --choice-config config/recipe-270m/self-play-4.json \
  ${sft_configs[@]+"${sft_configs[@]}"} \
  --grpo-config config/recipe-270m/grpo-cover.json \
  ${ship_evals[@]+"${ship_evals[@]}"} ${guard[@]+"${guard[@]}"} --stage-seconds "$R"

echo
echo "recipe finished; this invocation took $(( $(date +%s) - start ))s (stage times in seconds: $R/*.done)"
echo "evals: $R/eval_*.json   plots: $R/plots/   shipped adapter: $SHIP/"
echo "play:  $W play --adapter $SHIP"
