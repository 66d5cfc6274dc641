"""PERSEUS_ALLREDUCE_DTYPE (fp16/bf16 on the wire) and PERSEUS_ALLREDUCE_MODE
(hierarchical allreduce) under mpirun: tests/mpi/allreduce_modes.py checks every op,
dtype and scaling against a reference and the result bytes across ranks."""
import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(400)]

# Two lanes, small fusion buffers and MPI pieces: batches spread over both lanes'
# communicators and large tensors go in several windows.
LANES = {"PERSEUS_ALLREDUCE_STREAMS": "2", "PERSEUS_FUSION_THRESHOLD": "65536",
         "PERSEUS_CHUNK_SIZE": "16384"}


@pytest.mark.parametrize("nprocs,env", [
    (2, {"PERSEUS_ALLREDUCE_DTYPE": "fp16"}),
    (4, dict(LANES, PERSEUS_ALLREDUCE_DTYPE="bf16")),
], ids=["np2-fp16", "np4-bf16-lanes"])
def test_wire_dtype(run_mpi, nprocs, env):
    run_mpi("allreduce_modes", nprocs, env=env, timeout=360)
