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
