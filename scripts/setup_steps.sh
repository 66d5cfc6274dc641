# scripts/setup.sh's steps: each says what it does and how long it took the first
# time, shows that it is alive while it runs, and says how long it took here.
# Sourced by setup.sh (from the checkout's root); tests/launch/test_setup.py runs it alone.

# step "what it does" "first time" command...: says both, runs the command (with a
# line every 30 s, SETUP_TICK_S, while it runs, with the output of $PROGRESS where the
# call sets it: PROGRESS=function step ...), then says how long it took.
step() {
  local what=$1 about=$2 t0 ticker rc=0
  shift 2
  t0=$(date +%s)
  printf '[setup] %s (first time about %s) ...\n' "$what" "$about"
  tick "$t0" &
  ticker=$!
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  [ "$rc" = 0 ] || { printf '[setup]   failed after %ss: %s\n' "$(( $(date +%s) - t0 ))" "$what" >&2
                     return "$rc"; }
  printf '[setup]   done in %ss\n' "$(( $(date +%s) - t0 ))"
}
# A long step (the TensorFlow download, the Caffe build) printed nothing for minutes.
# sleep's output goes nowhere: a sleep left behind must not hold a pipe open.
tick() {
  local t0=$1 done_so_far
  while sleep "${SETUP_TICK_S:-30}" </dev/null >/dev/null 2>&1; do
    done_so_far=${PROGRESS:+, $($PROGRESS 2>/dev/null || true)}
    printf '[setup]   ... %ss so far%s\n' "$(( $(date +%s) - t0 ))" "$done_so_far"
  done
}
# Steps that need nothing from each other (the framework venvs, Caffe) run side by
# side: in_background step ... starts one, its output kept apart; finish_background
# prints each one's output in the order they started and fails if any failed.
BACKGROUND_PIDS=() BACKGROUND_LOGS=()
in_background() {
  local log
  log=$(mktemp)
  printf '[setup] started beside the others: %s\n' "$2"
  ( "$@" ) >"$log" 2>&1 </dev/null &
  BACKGROUND_PIDS+=("$!") BACKGROUND_LOGS+=("$log")
}
finish_background() {
  local i rc=0 one ticker t0
  t0=$(date +%s)
  tick "$t0" &
  ticker=$!
  for i in "${!BACKGROUND_PIDS[@]}"; do
    one=0
    wait "${BACKGROUND_PIDS[$i]}" || one=$?
    cat "${BACKGROUND_LOGS[$i]}"
    rm -f "${BACKGROUND_LOGS[$i]}"
    [ "$one" = 0 ] || rc=$one
  done
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  BACKGROUND_PIDS=() BACKGROUND_LOGS=()
  return "$rc"
}
# Progress of the steps that can show it: megabytes installed, objects compiled.
installed_mb() { printf '%s MB in %s' "$(du -sm "$1" | cut -f1)" "$1"; }
venv_progress() { installed_mb .venv; }
venv_tf_progress() { installed_mb .venv-tf; }
caffe_progress() {  # Ninja's (or make's) last [done/total] in the cache's build log
  local log step
  log="$(bash patches/bvlc_caffe/build.sh --cache-dir)/build.log"
  step=$(grep -oE '^\[ *[0-9]+(/[0-9]+|%)\]' "$log" 2>/dev/null | tail -1)
  printf '%s' "${step:+build step $step}"
}
core_progress() {
  printf '%s of %s sources compiled' \
    "$(find build/editable/temp/csrc -name '*.o' -newer build/editable/started 2>/dev/null | wc -l)" \
    "$(find csrc/src -name '*.cc' | wc -l)"
}
