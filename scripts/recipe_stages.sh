# Shared by the recipe scripts (train_270m_cpu.sh, train_4b.sh); sourced after they set R (the stage marker
# folder) and start (the script start time). DRY_RUN=1 prints each stage's command instead of running it.

stage() {  # stage NAME COMMAND...: run once; a finished stage is skipped on the next run
  local name=$1; shift
  if [ -f "$R/$name.done" ]; then echo "== $name: done earlier, skipped"; return; fi
  if [ "${DRY_RUN:-}" = 1 ]; then
    echo "== $name: $*"
  else
    echo; echo "== [$(( $(date +%s) - start ))s] $name"
    local t0=$(date +%s)
    "$@"
    echo "$(( $(date +%s) - t0 ))" > "$R/$name.done"
  fi
  if [ "${STOP_AFTER:-}" = "$name" ]; then echo "== stopping after $name (STOP_AFTER)"; exit 0; fi
}

train_or_resume() {  # train_or_resume RUN_DIR COMMAND...: resume RUN_DIR when it has a checkpoint
  local dir=$1; shift
  if compgen -G "$dir/checkpoints/*" > /dev/null; then "$@" --resume "$dir" --no-progress
  else "$@" --overwrite --no-progress; fi
}
