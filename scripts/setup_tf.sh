#!/usr/bin/env bash
# Creates .venv-tf beside this repo for the TensorFlow front end: TensorFlow needs
# numpy>=1.26 and a Python stack of its own, so it does not share .venv. Perseus is
# not rebuilt here: a .pth file points .venv-tf at this checkout, whose core library
# (perseus/lib/libperseus.so) scripts/setup.sh built with .venv's MPI; the mpich
# wheel here is the same version, so mpirun and mpi4py agree with it. Finally the
# Perseus TensorFlow ops are compiled against this TensorFlow (cached, see
# perseus/tensorflow/op_library.py). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || { echo "run scripts/setup.sh first (it builds the core)" >&2; exit 1; }
MPICH_VERSION=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('mpich'))")
[ -x .venv-tf/bin/python ] || "$PYTHON" -m venv .venv-tf
.venv-tf/bin/python -m pip install -q --disable-pip-version-check \
  "tensorflow-cpu==2.21.0" "numpy>=1.26" "mpich==$MPICH_VERSION" mpi4py pytest scikit-learn \
  cloudpickle
# Keras 2 for TF_USE_LEGACY_KERAS=1; --no-deps: it would pull a second TensorFlow.
.venv-tf/bin/python -m pip install -q --disable-pip-version-check --no-deps "tf-keras==2.21.0"
SITE=$(.venv-tf/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$(pwd)" > "$SITE/perseus-checkout.pth"
TF_CPP_MIN_LOG_LEVEL=2 .venv-tf/bin/python -m perseus.tensorflow.op_library
echo "Perseus for TensorFlow is ready in $(pwd)/.venv-tf"
