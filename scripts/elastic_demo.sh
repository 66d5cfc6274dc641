#!/usr/bin/env bash
# The main job, elastic: trains examples/pytorch/train_digits.py at np 4 on Open MPI 5 with
# ULFM (perseusrun --elastic), SIGKILLs rank 3 in the middle of epoch 2, and the three
# others go on from their last commit to the end. On a fresh machine it first makes what
# it needs: .venv (scripts/setup.sh), .venv-ompi5 (scripts/setup_ompi5.sh) and Perseus's
# core built against that MPI (cached in ~/.cache/perseus). Extra arguments go to
# train_digits.py (e.g. --epochs 10 --kill-at-epoch 4).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
[ -x .venv-ompi5/bin/mpirun ] || bash scripts/setup_ompi5.sh
.venv-ompi5/bin/python -c "import sklearn" 2>/dev/null ||
  .venv-ompi5/bin/python -m pip install -q --disable-pip-version-check scikit-learn
echo "[elastic_demo] building Perseus's core for Open MPI 5 (cached after the first time)"
PACKAGE=$(.venv/bin/python build_support/other_mpi_core.py open_mpi5_core .venv-ompi5/bin/mpicxx)
export PYTHONPATH="$PACKAGE${PYTHONPATH:+:$PYTHONPATH}"
# -P: the package above, not this checkout's perseus/ (built with .venv's MPICH)
exec .venv-ompi5/bin/python -P -m perseus.launcher --elastic -np 4 \
  --mpirun .venv-ompi5/bin/mpirun .venv-ompi5/bin/python examples/pytorch/train_digits.py \
  --elastic --kill-rank 3 --kill-at-epoch 1 --checkpoint '' "$@"
