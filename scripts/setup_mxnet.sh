#!/usr/bin/env bash
# Creates .venv-mx beside this repo for the MXNet front end: mxnet 1.9.1 imports
# only with numpy 1.23.5 (it uses np.bool), so it cannot share .venv or .venv-tf.
# Perseus is not rebuilt here: a .pth file points .venv-mx at this checkout, whose
# core library (perseus/lib/libperseus.so) scripts/setup.sh built with .venv's MPI
# (libperseus finds that MPI by its rpath; the tests run .venv's mpirun), so no MPI
# package is needed here. Finally the engine bridge (perseus/mxnet/csrc) is compiled
# and cached, see perseus/mxnet/engine_library.py. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
[ -x .venv/bin/python ] || { echo "run scripts/setup.sh first (it builds the core)" >&2; exit 1; }
[ -x .venv-mx/bin/python ] || "$PYTHON" -m venv .venv-mx
.venv-mx/bin/python -m pip install -q --disable-pip-version-check \
  "mxnet==1.9.1" "numpy==1.23.5" scikit-learn cloudpickle
SITE=$(.venv-mx/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$(pwd)" > "$SITE/perseus-checkout.pth"
.venv-mx/bin/python -m perseus.mxnet.engine_library
echo "Perseus for MXNet is ready in $(pwd)/.venv-mx"
