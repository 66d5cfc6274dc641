"""Diagnostics under mpirun: the stall inspector (tests/mpi/stall.py), with stall times
of a second or two so each case takes a few seconds. Both spellings of the variables
are exercised."""
import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

STALL_CASES = {
    "idle": {"PERSEUS_STALL_CHECK_TIME_SECONDS": "1"},
    "crossed": {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"},
    "shutdown": {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                 "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "1.5"},
}


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("case", list(STALL_CASES))
def test_stall_inspector(run_mpi, case, nprocs):
    run_mpi("stall", nprocs, env=dict(STALL_CASES[case], PTEST_STALL=case), timeout=60)


@pytest.mark.parametrize("nprocs", [2])
def test_stall_shutdown_alone(run_mpi, nprocs):
    # Warnings off, shutdown on: the inspector still runs for the shutdown.
    run_mpi("stall", nprocs, env={"PERSEUS_STALL_CHECK_TIME_SECONDS": "0", "PTEST_STALL": "shutdown",
                                  "PERSEUS_STALL_SHUTDOWN_TIME_SECONDS": "1.5"}, timeout=60)
