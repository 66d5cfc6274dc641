"""A peer SIGKILLed while the others are inside init() or shutdown() (issue 46), on Open
MPI 5 with ULFM at np 4: tests/rank_scripts/elastic_edges.py, real processes and signals.
The `ulfm` fixture (the core built against pip's Open MPI 5, mpirun --with-ft ulfm) is
tests/mpi/test_fault_tolerance.py's. Each job has a hard limit (bounded_job kills it), so
a hang fails its test; mpirun's exit code is checked, since it is the job's outcome.
The limit is well above a job's time (10-18 s at load 7 here) and below a hang's: a job
that waits for the dead rank never ends. PTEST_EDGE_LIMIT_S changes it.
"""
import os

import pytest

from support.jobs import RANK_SCRIPTS, bounded_job, job_report, rank_job
from test_fault_tolerance import ulfm  # noqa: F401 - a fixture: the core built with Open MPI 5

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

NP = 4
LIMIT_S = int(os.environ.get("PTEST_EDGE_LIMIT_S", "60"))


def run_edge(ulfm, edge, tmp_path, **settings):  # noqa: F811 - the fixture
    """Runs elastic_edges.py with PTEST_EDGE=edge and `settings` in its environment ->
    (returncode, stdout, report)."""
    scratch = tmp_path / edge
    scratch.mkdir()
    extra = dict(ulfm["env"], PTEST_EDGE=edge, **settings)
    cmd, env = rank_job([RANK_SCRIPTS / "elastic_edges.py"], NP, extra, LIMIT_S,
                        ulfm["python"], ulfm["launcher"], scratch)
    rc, out, err, seconds, killed = bounded_job(cmd, env, LIMIT_S)
    report = job_report("edge %s: exit code %s after %.1f s" % (edge, rc, seconds), cmd, extra,
                        out, err[-8000:])
    if killed is not None:
        pytest.fail("did not finish within %d s (a hang); still alive:\n%s\n%s"
                    % (LIMIT_S, killed, report), pytrace=False)
    return rc, out, report


def test_peer_dies_before_mpi_started(ulfm, tmp_path):  # noqa: F811
    """Rank 3 dies just before init(), the others inside MPI's start-up, which Open MPI
    does not finish without it (before the fix they waited there for good): at the peer
    timeout (2 s here: nothing can finish the start-up, so no margin is needed; CI time)
    each says why and leaves with exit code 1; mpirun's is 1."""
    rc, out, report = run_edge(ulfm, "mpi_start", tmp_path, PERSEUS_PEER_TIMEOUT_SECONDS="2")
    assert "MPI's start-up (MPI_Init_thread) did not finish within 2 s" in report, report
    assert "edge survivor ok" not in out, report
    assert rc == 1, report


def test_peer_dies_inside_init(ulfm, tmp_path):  # noqa: F811
    """Rank 3 dies inside init() once its MPI started, the others forming the world
    with it (before the fix: MPI_Comm_dup's error on MPI_COMM_WORLD aborted the job):
    their init() completes on the three survivors, hvd.elastic.run trains, the script
    checks the results, and mpirun's exit code is 0."""
    rc, out, report = run_edge(ulfm, "init", tmp_path)
    assert out.count("edge survivor ok, size 3") == 3, report
    assert "forming it again from the survivors" in report, report
    assert rc == 0, report


def test_peer_dies_during_shutdown(ulfm, tmp_path):  # noqa: F811
    """After training, rank 3 dies as the others call shutdown(): shutdown() returns on
    each of them, they leave, and mpirun ends the job with exit code 0."""
    rc, out, report = run_edge(ulfm, "shutdown", tmp_path)
    assert out.count("edge survivor ok, size 3") == 3, report
    assert rc == 0, report


def test_peer_dies_while_the_others_leave(ulfm, tmp_path):  # noqa: F811
    """Rank 3 dies once every rank's shutdown() returned, the others leaving (MPI_Finalize
    at exit, whose closing fence may wait for the dead rank: skipped where the failure
    is known, else bounded by the peer timeout, 5 s here): the job ends with exit code 0."""
    rc, out, report = run_edge(ulfm, "finalize", tmp_path, PERSEUS_PEER_TIMEOUT_SECONDS="5")
    assert out.count("edge survivor ok, size 3") == 3, report
    assert rc == 0, report


def test_peer_dies_during_reinit(ulfm, tmp_path):  # noqa: F811
    """Rank 3 dies inside a step's allreduce; rank 2 dies inside the re-init that
    follows, once the survivors' world is made (before the fix: init() failed there,
    and hvd.elastic.run with it): the re-init forms the world again, of ranks 0 and 1,
    which train on and finish."""
    rc, out, report = run_edge(ulfm, "reinit", tmp_path)
    assert out.count("edge survivor ok, size 2") == 2, report
    assert "forming it again from the survivors" in report, report
    assert rc == 0, report
