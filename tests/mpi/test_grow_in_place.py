"""Growing in place (issue 46, point 3): on Open MPI 5 with ULFM, perseusrun --elastic
--host-discovery-script adds ranks to the running job instead of restarting it.

The core is built against pip's Open MPI 5 wheel (.venv-ompi5, as
tests/mpi/test_fault_tolerance.py builds it). The discovery script prints localhost:2,
then localhost:4 (tests/rank_scripts/elastic_grow.py writes it while training): the two
running processes must go on with the same process ids and ranks 0 and 1, two new ones
join with ranks 2 and 3 (MPI_Comm_spawn, MPI_Intercomm_merge), and the training ends
with the script's checks (parameters identical to the bit on all 4 ranks, the loss
fallen); the same after a second grow, and after a rank died and the job shrank first.
Before this route the two ranks stopped at that commit for perseusrun to
restart the job on 4 new processes (the old processes' ids gone): the test fails there.
A process that dies during the grow (an old rank in the spawn, a new one before the
merge) must not hold the others: they leave it at once, not at the peer timeout, and
perseusrun restarts the job.
PERSEUS_SKIP_OMPI5=1 skips it.
"""
import re

import pytest

from support.jobs import RANK_SCRIPTS, clean_env, framework_python, run_bounded
from support.jobs import BUILD_SUPPORT  # noqa: F401 - puts build_support/ on sys.path
from other_mpi_core import build_core, package

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def ompi5(tmp_path_factory):
    """(.venv-ompi5's python, its mpirun, the PYTHONPATH of a perseus package whose core
    is the Open MPI 5 build)."""
    python = framework_python("Open MPI 5 (ULFM)", "ompi5", "setup_ompi5.sh")
    core = build_core("open_mpi5_core", str(python.parent / "mpicxx"))
    return python, python.parent / "mpirun", package(core, tmp_path_factory.mktemp("ompi5"))


def grow_job(ompi5, tmp_path, first, extra_env, limit_s=240):
    """elastic_grow.py under perseusrun --elastic, started on `first` ranks of this
    machine -> (rc, stdout, stderr, a report for the assertions)."""
    python, mpirun, pythonpath = ompi5
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:%d\n" % first)
    env = clean_env(dict({"PYTHONPATH": pythonpath, "PTEST_CHANGE_STEP": "3",
                          "PTEST_HOSTS_FILE": str(hosts), "PTEST_TMPDIR": str(tmp_path),
                          "PERSEUS_ELASTIC_PERSIST_DIR": str(tmp_path / "commits")}, **extra_env))
    # -P: `perseus` from PYTHONPATH (the Open MPI 5 build), not this checkout's.
    cmd = [python, "-P", "-m", "perseus.launcher", "--elastic", "--mpirun", mpirun,
           "--host-discovery-script", "cat %s" % hosts, "--min-np", "2", "--max-np", "4",
           python, RANK_SCRIPTS / "elastic_grow.py"]
    rc, out, err, seconds = run_bounded(cmd, env, limit_s)
    return rc, out, err, "rc %d after %.1f s\nstdout:\n%s\nstderr:\n%s" % (
        rc, seconds, out, err[-8000:])


@pytest.mark.parametrize("first, sizes, victim_step", [(2, "4", 0), (2, "3,4", 0), (3, "4", 2)],
                         ids=["2-4", "2-3-4", "3-died-2-4"])
def test_new_ranks_join_the_running_ones(ompi5, tmp_path, first, sizes, victim_step):
    """2 -> 4 ranks at once; 2 -> 3 -> 4 (a grow from a job that grew: the spawn from the
    merged world of old and new); and 3 ranks of which rank 2 is SIGKILLed at step 2,
    the two others shrinking in place (ULFM), then growing to 4 (the spawn from the
    survivors)."""
    rc, out, err, report = grow_job(ompi5, tmp_path, first, {
        "PTEST_SIZES": sizes, "PTEST_VICTIM_STEP": str(victim_step)})
    assert rc == 0, report
    assert "grows or shrinks it in place when hosts are added or removed" in err, report  # the mode
    start = {int(r): int(p) for r, p in re.findall(r"grow-start rank (\d) size %d pid (\d+) "
                                                   r"joined 0" % first, out)}
    assert sorted(start) == list(range(first)), report
    if victim_step:  # rank 2 died; the survivors shrank to 2 at one step
        victim = start.pop(2)
        shrunk = re.findall(r"reset callback rank (\d) size 2 step (\d+)", out)
        assert sorted(int(r) for r, _ in shrunk) == [0, 1], report
        assert len(set(step for _, step in shrunk)) == 1, report
    joined = {int(r): (int(n), int(p)) for r, n, p in re.findall(
        r"grow-start rank (\d) size (\d) pid (\d+) joined 1", out)}
    end = {int(r): (int(p), int(j)) for r, p, j in re.findall(
        r"grow-end rank (\d) size 4 local \1/4 pid (\d+) joined (\d) steps", out)}
    assert sorted(joined) == [2, 3], report
    assert sorted(end) == [0, 1, 2, 3], report
    if victim_step:
        assert victim not in [p for p, _ in end.values()], report
    for rank in (0, 1):  # the old ranks kept their processes and their ranks
        assert end[rank] == (start[rank], 0), (rank, report)
    for rank, (_, pid) in joined.items():
        assert end[rank] == (pid, 1), (rank, report)
    assert len(set(p for p, _ in end.values())) == 4, report
    before = 2
    for size in map(int, sizes.split(",")):
        # Every rank stopped at the same commit: the reset callbacks of the ranks there
        # before, at the new size, name one step, and the new ranks joined at it.
        resets = re.findall(r"reset callback rank (\d) size %d step (\d+)" % size, out)
        steps = set(step for _, step in resets) | set(re.findall(
            r"joined rank \d size %d at step (\d+)" % size, out))
        assert sorted(int(r) for r, _ in resets) == list(range(before)), (size, report)
        assert len(steps) == 1 and int(steps.pop()) >= 3, (size, report)
        assert sorted(r for r, (n, _) in joined.items() if n == size) == \
            list(range(before, size)), (size, report)
        assert "grew in place from %d to %d rank(s)" % (before, size) in err, report
        before = size
    assert "starting %d rank(s) on localhost:%d (run 0)" % (first, first) in err, report
    assert "(run 1)" not in err, report  # never restarted


def test_ranks_leave_in_place_and_others_join_again(ompi5, tmp_path):
    """4 -> 2 -> 4 ranks in one job: the discovery script offers localhost:2, and at one
    commit ranks 2 and 3 leave (their processes end) while ranks 0 and 1 go on in place,
    keeping their processes; then it offers localhost:4 again, and two new processes
    join the two (the spawn from the split job). The script's checks hold at the end
    (parameters identical to the bit on the 4, the loss fallen, every rank at one step).
    Before, the shrink restarted the job on 2 new processes (and the grow on 4)."""
    rc, out, err, report = grow_job(ompi5, tmp_path, 4, {"PTEST_SIZES": "2,4"})
    assert rc == 0, report
    start = {int(r): int(p) for r, p in re.findall(r"grow-start rank (\d) size 4 pid (\d+) "
                                                   r"joined 0", out)}
    assert sorted(start) == [0, 1, 2, 3], report
    for rank in (2, 3):
        assert "rank %d of 4 leaves the job" % rank in err, report
    assert err.count("leaves the job") == 2, report
    assert "shrank in place from 4 to 2 rank(s)" in err, report
    assert "grew in place from 2 to 4 rank(s)" in err, report
    # The two stayed at one commit, and ran their reset callback there, at size 2.
    shrunk = re.findall(r"reset callback rank (\d) size 2 step (\d+)", out)
    assert sorted(int(r) for r, _ in shrunk) == [0, 1] and len(set(s for _, s in shrunk)) == 1, \
        report
    joined = {int(r): int(p) for r, p in re.findall(
        r"grow-start rank (\d) size 4 pid (\d+) joined 1", out)}
    assert sorted(joined) == [2, 3], report
    end = {int(r): (int(p), int(j)) for r, p, j in re.findall(
        r"grow-end rank (\d) size 4 local \1/4 pid (\d+) joined (\d) steps", out)}
    assert end == {0: (start[0], 0), 1: (start[1], 0), 2: (joined[2], 1), 3: (joined[3], 1)}, \
        report
    assert not set(joined.values()) & set(start.values()), report
    assert "(run 1)" not in err, report  # never restarted


def test_a_grown_rank_that_would_leave_takes_the_restart(ompi5, tmp_path):
    """2 -> 4 -> 2 ranks: the grow is in place, but the shrink would end ranks 2 and 3,
    which the grow spawned, and Open MPI 5.0.11 ends the whole job when a spawned process
    leaves it (it does not make a spawned job fault tolerant): rank 0 says so and the
    job takes the restart, resuming on 2 new processes from the commit of the change,
    with the script's checks there."""
    rc, out, err, report = grow_job(ompi5, tmp_path, 2, {"PTEST_SIZES": "4,2"})
    assert rc == 0, report
    assert "grew in place from 2 to 4 rank(s)" in err, report
    assert "not resized in place (rank(s) 2,3 would leave, started by a grow" in err, report
    assert "leaves the job" not in err, report
    assert "starting 2 rank(s) on localhost:2 (run 1)" in err and "(run 2)" not in err, report
    resumed = re.findall(r"restart 1: resuming from persisted commit (\d+) on 2 rank", err)
    end = re.findall(r"grow-end rank (\d) size 2 local \1/2 pid (\d+) joined 0 steps (\d+)", out)
    assert len(resumed) == 1 and sorted(int(r) for r, _, _ in end) == [0, 1], report


def test_a_grown_rank_that_dies_takes_the_restart(ompi5, tmp_path):
    """2 -> 4 in place, then rank 3, which the grow spawned, SIGKILLed 2 steps later:
    Open MPI does not make a spawned job fault tolerant and ends the whole job, where a
    rank of mpirun's own job would have been left behind. The ranks left stop at their
    last persisted commit (exit code 77), or Open MPI kills them first (137): either way
    perseusrun restarts the job on 4 new processes from that commit, which train to the
    end with the script's checks. Before, the ranks left raced Open MPI: in 1 run of 3
    their recovery failed first (rank 2 killed by SIGTERM, 'the state's sync after a
    reset failed again on the same ranks'), the job ended with 1 and was not restarted."""
    rc, out, err, report = grow_job(ompi5, tmp_path, 2, {
        "PTEST_SIZES": "4", "PTEST_VICTIM_STEP": "2", "PTEST_VICTIM_JOINED": "1"})
    assert rc == 0, report
    assert "grew in place from 2 to 4 rank(s)" in err, report
    assert ("a rank was killed" in err or "a rank failed after the job grew in place, which "
            "Open MPI does not outlive" in err), report
    assert "starting 4 rank(s) on localhost:4 (run 1)" in err and "(run 2)" not in err, report
    resumed = re.findall(r"restart 1: resuming from persisted commit (\d+) on 4 rank", err)
    end = re.findall(r"grow-end rank (\d) size 4 local \1/4 pid (\d+) joined 0 steps (\d+)", out)
    assert len(resumed) == 1 and sorted(int(r) for r, _, _ in end) == [0, 1, 2, 3], report


@pytest.mark.parametrize("die", ["spawn", "child"], ids=["old-rank-dies-in-spawn",
                                                          "new-rank-dies-before-merge"])
def test_a_process_lost_in_the_grow_restarts_the_job(ompi5, tmp_path, die):
    """A process SIGKILLed during the grow 2 -> 4 (the core's hook
    PERSEUS_TEST_DIE_IN_GROW): rank 1 as MPI_Comm_spawn starts, or the last new process
    before MPI_Intercomm_merge. Every other process leaves the grow with exit code 75
    at once: rank 0's spawn fails, and the processes that wait for the dead one (the new
    ones in MPI_Init, the old ones spinning in the merge) see it end on this host, not
    at the peer timeout (30 s here, which the job must not wait out); perseusrun
    restarts the job on the 4 ranks from the commit persisted before the grow; it trains
    to the end there. Before, the job never ended for 'child' (the old ranks spun in the
    merge past 75 s) and ended with exit code 1, not restarted, for 'spawn' (rank 0
    aborted); then the others left at the peer timeout (10 s, 20-28 s of the test)."""
    rc, out, err, report = grow_job(ompi5, tmp_path, 2, {
        "PTEST_SIZES": "4", "PTEST_DIE_IN_GROW": die, "PERSEUS_PEER_TIMEOUT_SECONDS": "30"},
        limit_s=120)
    assert rc == 0, report
    assert "growing the job in place failed" in err, report
    assert "a process of the job on this host ended during" in err, report  # seen at once
    # ... and none of the grow's watches waited out the peer timeout
    assert not re.search(r"(growing the job in place failed|MPI's start-up).* did not finish "
                         r"within", err), report
    start = {int(r): int(p) for r, p in re.findall(r"grow-start rank (\d) size 2 pid (\d+) "
                                                   r"joined 0", out)}
    assert sorted(start) == [0, 1], report
    assert "grew in place" not in err and "joined 1" not in out, report
    assert "starting 4 rank(s) on localhost:4 (run 1)" in err and "(run 2)" not in err, report
    resumed = re.findall(r"restart 1: resuming from persisted commit (\d+) on 4 rank", err)
    assert len(resumed) == 1 and int(resumed[0]) >= 3, report
    # The restarted ranks: each ran its reset callback once, at the resumed commit, and
    # ended at one step with the same losses (its checks: parameters identical to the
    # bit, the loss fallen), in 4 new processes.
    resets = re.findall(r"reset callback rank (\d) size 4 step (\d+)", out)
    assert sorted(int(r) for r, _ in resets) == [0, 1, 2, 3], report
    assert set(step for _, step in resets) == set(resumed), report
    end = re.findall(r"grow-end rank (\d) size 4 local \1/4 pid (\d+) joined 0 steps (\d+) "
                     r"loss (\S+) -> (\S+)", out)
    assert sorted(int(r) for r, *_ in end) == [0, 1, 2, 3], report
    assert len(set(e[2:] for e in end)) == 1, report
    assert float(end[0][4]) < float(end[0][3]) / 10, report
    pids = set(int(e[1]) for e in end)
    assert len(pids) == 4 and not pids & set(start.values()), report
