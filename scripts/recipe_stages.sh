# Shared by the recipe scripts (train_270m_cpu.sh, train_4b.sh); sourced after they set R (the stage marker
# folder) and start (the script start time). DRY_RUN=1 prints each stage's command instead of running it.
# Long stages (training, self-play, cover, eval) show their progress (wordle_mlx/runtime/progress.py): a bar
# with speed and ETA in a terminal, a plain line every few seconds when the output goes to a log. Bash 3.2 (macOS's)
# runs these scripts: under set -u an array that may be empty is expanded as ${a[@]+"${a[@]}"}
# (tests/test_setup.py checks every script).

stage() {  # stage NAME COMMAND...: run once; a finished stage is skipped on the next run; <stage>.done holds its
           # seconds, summed over the runs an interrupted stage took
  local name=$1; shift
  if [ -f "$R/$name.done" ]; then echo "== $name: done earlier, skipped"; return; fi
  if [ "${DRY_RUN:-}" = 1 ]; then
    echo "== $name: $*"
  else
    echo; echo "== [$(( $(date +%s) - start ))s] $name"
    # an interrupted stage leaves its seconds so far in <stage>.partial; the run that finishes it adds them up
    local t0=$(date +%s) before=0 status=0
    if [ -f "$R/$name.partial" ]; then before=$(cat "$R/$name.partial"); fi
    "$@" || status=$?
    local seconds=$(( before + $(date +%s) - t0 ))
    if [ $status != 0 ]; then
      echo "$seconds" > "$R/$name.partial"
      echo "recipe stopped in stage $name (status $status); run it again to go on" >&2
      exit $status
    fi
    echo "$seconds" > "$R/$name.done"
    rm -f "$R/$name.partial"
  fi
  if [ "${STOP_AFTER:-}" = "$name" ]; then echo "== stopping after $name (STOP_AFTER)"; exit 0; fi
}

train_or_resume() {  # train_or_resume RUN_DIR COMMAND...: resume RUN_DIR when it has a checkpoint
  local dir=$1; shift
  if compgen -G "$dir/checkpoints/*" > /dev/null; then "$@" --resume "$dir"
  else "$@" --overwrite; fi
}
