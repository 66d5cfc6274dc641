"""Horovod parity of the PyTorch front end (tests/rank_scripts/torch_parity.py: sparse
allreduce, alltoall's return forms, collective gradients, optimizer-state
initialisation, warning/error texts, duplicate process sets, storage replaced in
flight), at 2 and 4 ranks, each job under a hard timeout."""
import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]


@pytest.mark.parametrize("nprocs", [2, 4])
def test_torch_parity(run_mpi, nprocs):
    run_mpi("torch_parity", nprocs, timeout=240)
