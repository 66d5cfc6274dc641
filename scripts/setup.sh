#!/usr/bin/env bash
# Creates .venv beside this repo with everything Perseus needs on a fresh machine
# (MPI from the mpich wheel, PyTorch CPU, test tools) and installs Perseus into it.
# Safe to re-run: it only adds what is missing and rebuilds the core.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# nvidia-nccl-cu13: the real libnccl.so.2 for the GPU loader's tests on this CPU-only
# machine (~305 MB download, ~345 MB installed, ~20 s); nothing else uses it here.
.venv/bin/python -m pip install -q --disable-pip-version-check \
  "torch==2.13.0" numpy mpich mpi4py pytest pytest-timeout scikit-learn h5py \
  "nvidia-nccl-cu13==2.32.3"
# Debian's Open MPI as a second MPI, for tests/test_open_mpi.py (the core built against
# it: a plain python and mpirun -np 2) and tests/test_build_mpi.py (its libmpi.so in
# Debian python's library folder, which once got linked into the MPICH build). As root,
# ~10 s from the machine's apt cache. It puts Open MPI's mpicxx and mpirun on PATH;
# setup.py, the tests and perseusrun still take the venv's MPICH first.
# PERSEUS_SKIP_OPEN_MPI=1 leaves it out, and those tests then skip, saying why.
if [ "${PERSEUS_SKIP_OPEN_MPI:-0}" != 1 ] && ! command -v mpicxx.openmpi >/dev/null; then
  SUDO=
  [ "$(id -u)" = 0 ] || SUDO=sudo
  install_open_mpi() {
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libopenmpi-dev openmpi-bin >/dev/null
  }
  install_open_mpi || { $SUDO apt-get update -q >/dev/null && install_open_mpi; }
fi
# -e: the core library is built in place (perseus/lib/libperseus.so).
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
echo "Perseus is installed in $(pwd)/.venv"
# The TensorFlow front end lives in a venv of its own (tests/test_tensorflow.py
# runs it); PERSEUS_SKIP_TF=1 leaves it out.
if [ "${PERSEUS_SKIP_TF:-0}" != 1 ]; then
  bash scripts/setup_tf.sh
fi
# The MXNet front end too (mxnet 1.9.1 needs numpy 1.23.5): .venv-mx, tested by
# tests/test_mxnet.py; PERSEUS_SKIP_MX=1 leaves it out.
if [ "${PERSEUS_SKIP_MX:-0}" != 1 ]; then
  bash scripts/setup_mxnet.sh
fi
# BVLC Caffe with the Perseus patch (patches/bvlc_caffe/; tests/test_caffe.py): apt
# build dependencies (root), then a CPU-only build cached in .cache/bvlc_caffe (~10
# CPU-minutes cold, seconds once cached). PERSEUS_SKIP_CAFFE=1 leaves it out.
if [ "${PERSEUS_SKIP_CAFFE:-0}" != 1 ]; then
  bash patches/bvlc_caffe/install_deps.sh
  bash patches/bvlc_caffe/build.sh
fi
