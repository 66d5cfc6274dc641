"""Diagnostics under mpirun: the stall inspector (tests/rank_scripts/stall.py), with stall times
of a second or two so each case takes a few seconds. Both spellings of the variables
are exercised."""
import pytest

from support import init_batch

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

STALL_CASES = {
    "idle": {"PERSEUS_STALL_CHECK_TIME_SECONDS": "1"},
    "crossed": {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"},
    "shutdown": {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                 "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "1.5"},
}


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("setting", list(STALL_CASES))
def test_stall_inspector(run_mpi_batch, setting, nprocs):
    # The three cases in one job per np, each a fresh init() ("shutdown", which leaves the
    # engine stopped, last): run_mpi_batch's settings.
    settings = {case: dict(env, PTEST_STALL=case) for case, env in STALL_CASES.items()}
    run_mpi_batch("stall", nprocs, ["stall"], settings=settings, setting=setting, timeout=90)


@pytest.mark.parametrize("nprocs", [2])
def test_stall_shutdown_alone(run_mpi, nprocs):
    # Warnings off, shutdown on: the inspector still runs for the shutdown.
    run_mpi("stall", nprocs, env={"PERSEUS_STALL_CHECK_TIME_SECONDS": "0", "PTEST_STALL": "shutdown",
                                  "PERSEUS_STALL_SHUTDOWN_TIME_SECONDS": "1.5"}, timeout=60)


# A long hold: the script's fused case submits many requests on every rank before any
# waits, and they must all go in one round (only a wait ends the hold).
NAN_HOLD = {"PERSEUS_HOLD_TIME": "60000"}


# At np 2, both settings in one job (run_mpi_batch's settings), each a fresh init().
NAN_NP2 = {"plain": {"PERSEUS_ALLREDUCE_NANCHECK": "1"},
           "lanes-tiny-fusion": {"PERSEUS_ALLREDUCE_NANCHECK": "true", "PERSEUS_ALLREDUCE_STREAMS": "3",
                                 "PERSEUS_FUSION_THRESHOLD": "64"}}


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_nan_check(run_mpi, run_mpi_batch, nprocs):
    if nprocs == 2:
        run_mpi_batch("nan_check", 2, ["nan_check"], env=NAN_HOLD, settings=NAN_NP2, setting="plain",
                      timeout=90)
    else:
        run_mpi("nan_check", nprocs, env=dict(NAN_HOLD, **NAN_NP2["plain"]), timeout=90)


def test_nan_check_with_lanes_and_tiny_fusion(run_mpi_batch):
    run_mpi_batch("nan_check", 2, ["nan_check"], env=NAN_HOLD, settings=NAN_NP2,
                  setting="lanes-tiny-fusion", timeout=90)


# ---------------------------------------------------------------- settings (one process)

INIT_SNIPPET = """
import sys, torch
import perseus.torch.horovod as hvd
try:
    hvd.init()
except ValueError as e:
    print("VALUE_ERROR:", e)
    sys.exit(0)
try:
    hvd.allreduce(torch.tensor([1.0, float("nan")]), name="g")
    print("NO_ERROR")
except hvd.HorovodInternalError as e:
    print("RAISED:", e)
hvd.shutdown()
"""


BAD_SETTINGS = [
    ("PERSEUS_ALLREDUCE_NANCHECK", "maybe"),
    ("PERSEUS_STALL_SHUTDOWN_TIME_SECONDS", "-1"),
    ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "soon"),
]
NAN_CHECK_VALUES = [("1", True), ("on", True), ("0", False), ("off", False)]


@pytest.fixture(scope="module")
def init_results():
    """Every case of the two tests below in one process (support/init_batch.py)."""
    cases = {"%s=%s" % kv: ({kv[0]: kv[1]}, INIT_SNIPPET) for kv in BAD_SETTINGS}
    cases.update({"NANCHECK=%s" % v: ({"PERSEUS_ALLREDUCE_NANCHECK": v}, INIT_SNIPPET) for v, _ in NAN_CHECK_VALUES})
    return init_batch.run(cases)


@pytest.mark.parametrize("variable,value", BAD_SETTINGS)
def test_bad_diagnostic_setting_fails_init(init_results, variable, value):
    result = init_results["%s=%s" % (variable, value)]
    assert "VALUE_ERROR:" in result.stdout and variable in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("value,raises", NAN_CHECK_VALUES)
def test_nan_check_in_a_world_of_one(init_results, value, raises):
    result = init_results["NANCHECK=%s" % value]
    want = "RAISED:" if raises else "NO_ERROR"
    assert want in result.stdout, result.stdout + result.stderr
    if raises:
        assert "tensor 'allreduce.g' on rank(s) [0]" in result.stdout, result.stdout
