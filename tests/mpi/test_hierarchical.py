"""PERSEUS_ALLREDUCE_DTYPE (fp16/bf16 on the wire) and PERSEUS_ALLREDUCE_MODE
(hierarchical allreduce) under mpirun: tests/rank_scripts/allreduce_modes.py checks every op,
dtype and scaling against a reference and the result bytes across ranks, on the
global set and on sets that span the simulated nodes unevenly (flat fallback)."""

import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(900)]

# Two lanes, small fusion buffers and MPI pieces: batches spread over both lanes'
# communicators and large tensors go in several windows.
LANES = {"PERSEUS_ALLREDUCE_STREAMS": "2", "PERSEUS_FUSION_THRESHOLD": "65536",
         "PERSEUS_CHUNK_SIZE": "16384"}
HIER = {"PERSEUS_ALLREDUCE_MODE": "hierarchical", "PERSEUS_RANKS_PER_NODE": "2"}


# The runs at np 4, in one job (run_mpi_batch's settings): each a fresh init() that
# reads its settings, one mpirun and one torch import per rank instead of five.
NP4 = {
    "np4-bf16-lanes": dict(LANES, PERSEUS_ALLREDUCE_DTYPE="bf16"),
    "np4-2x2": HIER,                                            # 2 simulated nodes of 2
    "np4-2x2-lanes": dict(LANES, **HIER),                       # ... on two lanes, in pieces
    "np4-1node-horovod-name": {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"},  # 1 node of 4
    "np4-2x2-fp16": dict(LANES, PERSEUS_ALLREDUCE_DTYPE="fp16", **HIER),
}
OTHERS = {
    "np2-fp16": (2, {"PERSEUS_ALLREDUCE_DTYPE": "fp16"}),
    "np3-uneven": (3, HIER),                                    # nodes of 2 and 1: flat fallback
}


def run_modes(run_mpi, run_mpi_batch, setting):
    if setting in NP4:
        run_mpi_batch("allreduce_modes", 4, ["allreduce_modes"], settings=NP4, setting=setting,
                      timeout=360)
    else:
        nprocs, env = OTHERS[setting]
        run_mpi("allreduce_modes", nprocs, env=env, timeout=360)


@pytest.mark.parametrize("setting", ["np2-fp16", "np4-bf16-lanes"])
def test_wire_dtype(run_mpi, run_mpi_batch, setting):
    run_modes(run_mpi, run_mpi_batch, setting)


@pytest.mark.parametrize("setting", ["np4-2x2", "np4-2x2-lanes", "np4-1node-horovod-name",
                                     "np3-uneven", "np4-2x2-fp16"])
def test_hierarchical(run_mpi, run_mpi_batch, setting):
    run_modes(run_mpi, run_mpi_batch, setting)


SETTINGS_CASES = [
    ({"PERSEUS_ALLREDUCE_MODE": "tree"}, "PERSEUS_ALLREDUCE_MODE='tree' is invalid"),
    ({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}, "SETTINGS hierarchical"),
    ({"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}, "SETTINGS flat"),
    ({"HOROVOD_HIERARCHICAL_ALLGATHER": "1"}, "hierarchical allgather is not implemented"),
    ({"HOROVOD_HIERARCHICAL_ALLGATHER": "0"}, "SETTINGS flat"),
    ({"PERSEUS_ALLREDUCE_DTYPE": "fp8"}, "PERSEUS_ALLREDUCE_DTYPE='fp8' is invalid"),
]


@pytest.fixture(scope="module")
def settings_outputs(settings_at_init):
    return settings_at_init([env for env, _ in SETTINGS_CASES], ("PERSEUS_ALLREDUCE_MODE",))


@pytest.mark.parametrize("case", range(len(SETTINGS_CASES)), ids=[e for _, e in SETTINGS_CASES])
def test_settings(settings_outputs, case):
    output, expect = settings_outputs[case], SETTINGS_CASES[case][1]
    assert expect in output, output
