#!/usr/bin/env bash
# Sets up this checkout on a fresh machine. Safe to re-run: it only adds what is
# missing, and rebuilds the core only when its sources changed (a rerun with nothing
# changed takes seconds: 6 s, or 30 s with --all).
#
#   bash scripts/setup.sh          # the main job: .venv with PyTorch, MPI and Perseus
#   bash scripts/setup.sh --all    # and everything the tests need
#
# The main job (./train.sh) needs only .venv: PyTorch, numpy, scikit-learn (the digits),
# MPI from the mpich wheel (mpirun, mpicc, mpi.h), mpi4py, and Perseus built in place.
# --all adds the test tools, ccache, NCCL's library, Debian's Open MPI, Debian's Slurm
# and the tools that make namespace hosts, the TensorFlow, MXNet and Open MPI 5 (ULFM)
# venvs and the patched Caffe; PERSEUS_SKIP_TF=1, PERSEUS_SKIP_MX=1, PERSEUS_SKIP_OMPI5=1,
# PERSEUS_SKIP_CAFFE=1, PERSEUS_SKIP_OPEN_MPI=1 and PERSEUS_SKIP_SLURM=1 leave those out
# (their tests then say so).
# Each step prints what it does and how long it took the first time on a quiet 2-core
# machine with a warm download cache (the main job 84 s, --all 457 s; a loaded machine
# takes several times longer), a line every 30 s while it runs, then its time here.
set -euo pipefail
cd "$(dirname "$0")/.."
ALL=0
case "${1:-}" in
  --all) ALL=1 ;;
  "") ;;
  -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup.sh: unknown argument $1 (use --all, or nothing)" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
SETUP_START=$(date +%s)

# step, tick and the steps' progress reports.
source scripts/setup_steps.sh
pip_install() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }

[ -x .venv/bin/python ] || step "creating .venv with $PYTHON" "5 s" "$PYTHON" -m venv .venv
# torch pinned: unpinned, pip may take a multi-GB CUDA build where a CPU one was meant.
# On a GPU machine with PyPI, torch==2.13.0 is the CUDA build (PyPI's Linux default).
# setuptools (pyproject.toml's build requirement) here, so that the core's build below
# needs no isolated build environment of its own each time (5-8 s of a rerun).
PROGRESS=venv_progress step "installing PyTorch 2.13.0, numpy, scikit-learn, cloudpickle, MPICH and mpi4py into .venv" "45 s" \
  pip_install "torch==2.13.0" numpy scikit-learn cloudpickle mpich mpi4py "setuptools>=64" wheel
# -e: the core library is built in place (perseus/lib/libperseus.so), compiled in parallel;
# setup.py keeps the objects in build/editable/ and skips an unchanged core.
mkdir -p build/editable && touch build/editable/started
PROGRESS=core_progress step "building Perseus's core with .venv's mpicxx and installing it (pip install -e .)" "35 s" \
  pip_install --no-build-isolation -e .
if [ "$ALL" = 0 ]; then
  echo "[setup] Perseus is installed in $(pwd)/.venv ($(( $(date +%s) - SETUP_START ))s);" \
       "run: .venv/bin/mpirun -np 2 ./train.sh"
  exit 0
fi

# ---------------------------------------------------------------- --all: the tests' needs
# nvidia-nccl-cu13: the real libnccl.so.2 for the GPU loader's tests on a CPU-only
# machine (~305 MB download, ~345 MB installed); matplotlib: the benchmarks' --plot;
# docs/requirements.txt: MkDocs for the documentation site, which tests/meta/test_docs.py builds;
# expecttest: imported by torch's own distributed test suite (tests/torch_suite/);
# pytest-xdist: the suite on several workers, pytest -n N (tests/README.md).
step "installing the test tools, h5py, matplotlib, MkDocs and NCCL's library into .venv" "17 s" \
  pip_install pytest pytest-timeout pytest-xdist h5py matplotlib "nvidia-nccl-cu13==2.32.3" \
  "expecttest==0.3.0" -r docs/requirements.txt
# The tools torch users train with, for tests/mpi/test_torch_tools.py and
# benchmarks/tools_bench.py: PyTorch Lightning (pytorch-lightning, without the larger
# `lightning` bundle), DeepSpeed (an sdist whose build uses the torch above; no op is
# compiled) and accelerate. Pinned: each accepts torch 2.13.0 and leaves it as it is.
step "installing PyTorch Lightning, DeepSpeed and accelerate into .venv" "25 s" \
  pip_install "pytorch-lightning==2.6.6" "deepspeed==0.19.8" "accelerate==1.15.0"
# ccache: setup.py compiles the core through it where it is installed, and so does the
# Caffe build, keyed by content under ~/.cache/ccache: a fresh clone, or the core built
# against another MPI by the tests (build_support/other_mpi_core.py: Open MPI 4 and 5),
# recompiles only the sources that changed since any build on this machine (the two
# other cores took 63 s and 142 s of a loaded CI run, each rebuilt from scratch).
install_ccache() {
  local sudo=
  [ "$(id -u)" = 0 ] || sudo=sudo
  apt_ccache() {
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      ccache >/dev/null
  }
  apt_ccache || { $sudo apt-get update -q >/dev/null && apt_ccache; }
}
if ! command -v ccache >/dev/null; then
  step "installing ccache (apt, root or sudo)" "5 s" install_ccache
fi
# Debian's Open MPI as a second MPI, for tests/launch/test_open_mpi.py (the core built against
# it: a plain python and mpirun -np 2) and tests/launch/test_build_mpi.py (its libmpi.so in
# Debian python's library folder, which once got linked into the MPICH build). It puts
# Open MPI's mpicxx and mpirun on PATH; setup.py, the tests and perseusrun still take
# the venv's MPICH first.
install_open_mpi() {
  local sudo=
  [ "$(id -u)" = 0 ] || sudo=sudo
  apt_open_mpi() {
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libopenmpi-dev openmpi-bin >/dev/null
  }
  apt_open_mpi || { $sudo apt-get update -q >/dev/null && apt_open_mpi; }
}
if [ "${PERSEUS_SKIP_OPEN_MPI:-0}" != 1 ] && ! command -v mpicxx.openmpi >/dev/null; then
  step "installing Debian's Open MPI (apt, root or sudo)" "12 s" install_open_mpi
fi
# Debian's Slurm (slurmctld, slurmd, munge) for tests/launch/test_slurm.py, which starts a
# one-node cluster of its own; iproute2 and util-linux (ip, unshare, nsenter, setpriv)
# for the namespace hosts of tests/launch/test_multi_host.py. Installed without starting the
# packages' services (policy-rc.d, where the machine has none of its own): the tests run
# their own daemons with their own configuration.
install_cluster_tools() {
  local sudo= policy=/usr/sbin/policy-rc.d made=
  [ "$(id -u)" = 0 ] || sudo=sudo
  if [ ! -e $policy ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee $policy >/dev/null && $sudo chmod 755 $policy
    made=1
  fi
  apt_cluster_tools() {
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      iproute2 util-linux slurmctld slurmd slurm-client munge >/dev/null
  }
  apt_cluster_tools || { $sudo apt-get update -q >/dev/null && apt_cluster_tools; } || {
    [ -z "$made" ] || $sudo rm -f $policy; return 1; }
  [ -z "$made" ] || $sudo rm -f $policy
}
if [ "${PERSEUS_SKIP_SLURM:-0}" != 1 ] && ! { command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v nsenter >/dev/null && command -v ip >/dev/null; }; then
  step "installing Debian's Slurm and munge, iproute2 (apt, root or sudo)" "8 s" install_cluster_tools
fi
# The TensorFlow and MXNet front ends live in venvs of their own (mxnet 1.9.1 needs
# numpy 1.23.5); tests/frameworks/test_tensorflow.py and tests/frameworks/test_mxnet.py run them.
# These venvs and Caffe need nothing from each other: they are made side by side.
if [ "${PERSEUS_SKIP_TF:-0}" != 1 ]; then
  PROGRESS=venv_tf_progress in_background \
    step "creating .venv-tf: TensorFlow 2.21 (1.6 GB) and Perseus's TensorFlow op" "75 s" \
    bash scripts/setup_tf.sh
fi
# Open MPI 5 with ULFM (pip's wheel) in a venv of its own, for the fault-tolerance tests.
if [ "${PERSEUS_SKIP_OMPI5:-0}" != 1 ]; then
  in_background step "creating .venv-ompi5: Open MPI 5 with ULFM, and PyTorch" "40 s" \
    bash scripts/setup_ompi5.sh
fi
if [ "${PERSEUS_SKIP_MX:-0}" != 1 ]; then
  in_background step "creating .venv-mx: MXNet 1.9.1 and Perseus's MXNet engine library" "30 s" \
    bash scripts/setup_mxnet.sh
fi
# BVLC Caffe with the Perseus patch (tests/frameworks/test_caffe.py): apt build dependencies, then
# a CPU-only build cached outside the checkout (patches/bvlc_caffe/build.sh says where).
caffe() {
  step "installing Caffe's build dependencies (apt, root or sudo)" "15 s" \
    bash patches/bvlc_caffe/install_deps.sh
  PROGRESS=caffe_progress step "building the patched BVLC Caffe, or finding it in the cache" "220 s" \
    bash patches/bvlc_caffe/build.sh
}
if [ "${PERSEUS_SKIP_CAFFE:-0}" != 1 ]; then
  in_background caffe "Caffe's build dependencies and the patched BVLC Caffe"
fi
finish_background
echo "[setup] everything for the tests is ready ($(( $(date +%s) - SETUP_START ))s);" \
     "run: .venv/bin/python -m pytest -q"
