"""Failure behaviour across ranks: a rank that dies or leaves mid-training must never
leave the others hanging. Each case runs tests/rank_scripts/dead_rank.py under mpirun and checks
how fast the job ended after the victim left, and what the survivors said.

What ends the survivors depends on how the victim left:
- killed (SIGKILL): MPICH's launcher (hydra) sees the abnormal exit and kills every
  other rank ("BAD TERMINATION"), within about a second; survivors get no chance to
  print. Open MPI's mpirun behaves the same way.
- exit without shutdown(), or shutdown() while the others still submit: the victim's
  engine announces that it is leaving in its last negotiation round, and every
  survivor's pending and later requests fail with HorovodInternalError naming it.
- os._exit(), an uncaught exception, a fatal signal: the same announcement says how the
  victim is ending, and each survivor warns with it at once, since hydra kills the
  survivors within milliseconds of such an end.
"""
import os
import signal
import sys
import time

import pytest

from support.jobs import RANK_SCRIPTS, clean_env, find_mpirun, run_bounded

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

BOUND_S = 30  # the bound: survivors end within this long after a rank left
HARD_TIMEOUT_S = 90


def run_dead_rank(tmp_path, np, leave, workload):
    cmd = [find_mpirun(), "-np", str(np), sys.executable, str(RANK_SCRIPTS / "dead_rank.py")]
    # A live rank prints its Python stacks shortly before the hard timeout.
    env = clean_env({"PTEST_TMPDIR": str(tmp_path), "PTEST_LEAVE": leave,
                     "PTEST_WORKLOAD": workload, "PTEST_HANG_DUMP_S": str(HARD_TIMEOUT_S - 10)})
    rc, out, err, _ = run_bounded(cmd, env, HARD_TIMEOUT_S)
    ended = time.time()
    left_file = tmp_path / "left"
    assert left_file.exists(), "the victim never left\nstdout:\n%s\nstderr:\n%s" % (out, err)
    return rc, ended - float(left_file.read_text()), out, err


@pytest.mark.parametrize("np", [2, 4])
@pytest.mark.parametrize("workload", ["allreduce", "optimizer"])
def test_killed_rank_tears_the_job_down(tmp_path, np, workload):
    rc, after, out, err = run_dead_rank(tmp_path, np, "kill", workload)
    report = "rc %d, %.1f s after the kill\nstdout:\n%s\nstderr:\n%s" % (rc, after, out, err)
    assert rc != 0, report
    assert after < BOUND_S, report
    assert "NO ERROR" not in out, report
    assert "Killed" in out + err or "SURVIVOR" in out, report  # hydra names the signal


@pytest.mark.parametrize("np", [2, 4])
@pytest.mark.parametrize("leave", ["exit", "shutdown"])
def test_rank_leaving_early_fails_the_others(tmp_path, np, leave):
    workload = "optimizer" if leave == "exit" else "allreduce"
    rc, after, out, err = run_dead_rank(tmp_path, np, leave, workload)
    report = "rc %d, %.1f s after leaving\nstdout:\n%s\nstderr:\n%s" % (rc, after, out, err)
    assert after < BOUND_S, report
    for rank in range(np - 1):
        want = "SURVIVOR %d HorovodInternalError: Perseus was shut down on rank(s) [%d]" % (rank, np - 1)
        assert want in out, "rank %d did not report the error\n%s" % (rank, report)


@pytest.mark.parametrize("np,leave,how", [
    (2, "os_exit", "called os._exit(3)"),
    (4, "os_exit", "called os._exit(3)"),
    (2, "segv", "was killed by SIGSEGV"),
    (3, "raise", "ended with an uncaught Victim: left at step 20"),
])
def test_survivors_say_which_rank_ended_and_how(tmp_path, np, leave, how):
    """Issue 49 (3): a rank that ends badly makes mpirun kill the others within
    milliseconds; before that, every survivor warns naming the rank and how it ended
    (before: exit code 3 and nothing printed on any rank)."""
    rc, after, out, err = run_dead_rank(tmp_path, np, leave, "allreduce")
    report = "rc %d, %.1f s after leaving\nstdout:\n%s\nstderr:\n%s" % (rc, after, out, err)
    assert rc != 0 and after < BOUND_S, report
    victim = np - 1
    for rank in range(np):
        line = "[perseus WARNING rank %d] rank %d %s and has left the job" % (rank, victim, how)
        assert (line in err) == (rank != victim), "rank %d: %r\n%s" % (rank, line, report)


@pytest.mark.parametrize("np", [2, 3])
def test_exit_inside_an_mpi_call_ends_the_job(tmp_path, np):
    """Issue 16 (1b): exit() from inside one of the engine's MPI calls (the test hook
    stands in for MPI giving up on a failed call) ends that process at once, with its
    code, and mpirun ends the job; before, the exit handler waited for the engine."""
    victim = np - 1
    cmd = [find_mpirun(), "-np", str(np), sys.executable, str(RANK_SCRIPTS / "exit_in_mpi.py")]
    env = clean_env({"PTEST_TMPDIR": str(tmp_path), "PTEST_EXIT_RANK": str(victim),
                     "PTEST_HANG_DUMP_S": "50"})
    rc, out, err, _ = run_bounded(cmd, env, 60)
    ended = time.time()
    report = "rc %d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err)
    assert (tmp_path / "exiting").exists(), report
    assert ended - float((tmp_path / "exiting").read_text()) < BOUND_S, report
    assert rc != 0, report  # 70 (the exit), or 9 for the survivors hydra killed
    assert "returned from the allreduce" not in out + err, report


def test_forked_child_exits_and_refuses_calls(run_mpi):
    """Issue 16 (8): a child forked after init() exits cleanly and every Perseus call in
    it raises a clear error; the parent goes on working."""
    for np in (2, 3):
        run_mpi("fork_child", np, timeout=90)


@pytest.mark.parametrize("np", [2, 3])
def test_same_name_for_different_collectives_is_a_mismatch(run_mpi, np):
    """Issue 16 (2): one name, different collectives on different ranks: an error on every
    rank naming each rank's collective, in about a second; the name works afterwards."""
    run_mpi("mismatch_collectives", np, timeout=120)


@pytest.mark.parametrize("np", [2, 3])
def test_stall_warning_names_the_rank_that_stopped_submitting(run_mpi, np):
    """Issue 16 (5): a request one rank refused locally leaves the others waiting; the
    stall warning names that rank and what it submitted last."""
    run_mpi("refused_locally", np, env={"PERSEUS_STALL_CHECK_TIME_SECONDS": "1"}, timeout=90)


@pytest.mark.parametrize("np", [2, 3])
def test_add_process_set_on_some_ranks_fails_naming_the_absent(run_mpi, np):
    """Issue 16 (4): add_process_set called by only some ranks fails on those, after the
    stall check time, naming the ranks that did not call it; nothing hangs. Issue 37 (9):
    the same for start_timeline, which is collective."""
    run_mpi("partial_process_set", np, env={"PERSEUS_STALL_CHECK_TIME_SECONDS": "1"}, timeout=90)


@pytest.mark.parametrize("np", [2, 3])
def test_grouped_calls_of_different_sizes_fail_everywhere(run_mpi, np):
    """Issue 16 (3): a grouped collective with a different number of tensors per rank fails
    on every rank (before, the rank with fewer returned and the others hung)."""
    run_mpi("mismatch_groups", np, timeout=120)


CHAOS = {"defaults": {}, "lanes2-fusion256": {"PERSEUS_ALLREDUCE_STREAMS": "2",
                                               "PERSEUS_FUSION_THRESHOLD": "256"}}


@pytest.mark.parametrize("nprocs,setting", [(2, "defaults"), (3, "defaults"), (3, "lanes2-fusion256")])
def test_chaos(run_mpi_batch, nprocs, setting):
    """Issue 16: bad requests (a different collective, group size, op, dtype or shape on
    one random rank) among correct ones, at random: the same error on every rank for each
    bad one, bit-identical correct results for the others, no hang. PTEST_CHAOS_SEED
    replays a failing plan (the script prints its seed). The settings at np 3 in one job
    (run_mpi_batch's settings)."""
    env = {"PTEST_CHAOS_SEED": os.environ.get("PTEST_CHAOS_SEED", "1616")}
    settings = CHAOS if nprocs == 3 else {"defaults": {}}
    run_mpi_batch("chaos", nprocs, ["chaos"], env=env, settings=settings, setting=setting,
                  timeout=180)


@pytest.mark.parametrize("np", [2, 3])
def test_tensor_grown_in_flight(run_mpi, np):
    """Issue 16 (7): a tensor grown (resize_() to 100x, an out= op) while its request is in
    flight: torch's "not resizable" error on the caller's thread, the right result on
    every rank, the tensor usable at its new size afterwards, repeated. glibc unmaps every
    freed block over 64 KiB here, so a use of freed memory would be a SIGSEGV (as it was
    before the pin)."""
    run_mpi("grow_in_flight", np, env={"MALLOC_MMAP_THRESHOLD_": "65536"}, timeout=180)


FROZEN_HARD_TIMEOUT_S = 40


@pytest.mark.parametrize("np,where", [(2, "stop"), (4, "stop_in_collective"), (3, "stop_ddp")])
def test_stopped_rank_is_named_and_the_job_ends(tmp_path, np, where):
    """Issue 37 (2): one rank stopped with SIGSTOP while the others wait on an allreduce,
    before it submitted it (np 2) or inside the collective itself (np 4: the others are
    blocked in it), or in torch's DDP over the "perseus" backend (np 3: its reducer's
    failed future, a segfault before; issue 48). Each other rank warns within the check time that it is not
    responding, fails at the shutdown time with an error naming it (checked in
    tests/rank_scripts/frozen_rank.py), and exits; mpirun then ends the job, the stopped rank
    included. Before, nothing was reported and the job hung."""
    check_s, shutdown_s = 2.0, 3.0
    cmd = [find_mpirun(), "-np", str(np), sys.executable, str(RANK_SCRIPTS / "frozen_rank.py")]
    env = clean_env({"PTEST_TMPDIR": str(tmp_path), "PTEST_FROZEN": where,
                     "PERSEUS_STALL_CHECK_TIME_SECONDS": str(check_s),
                     "PERSEUS_STALL_SHUTDOWN_TIME_SECONDS": str(shutdown_s),
                     "PTEST_HANG_DUMP_S": str(FROZEN_HARD_TIMEOUT_S - 10)})
    victim_file = tmp_path / "stopped"
    try:
        rc, out, err, _ = run_bounded(cmd, env, FROZEN_HARD_TIMEOUT_S)
        ended = time.time()
    finally:
        if victim_file.exists():  # SIGKILL ends a stopped process too
            try:
                os.kill(int(victim_file.read_text().split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
    report = "rc %d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err[-6000:])
    pid, stopped_at = victim_file.read_text().split()
    assert rc != 0, report
    for rank in range(np - 1):
        assert "SURVIVOR %d ok" % rank in out, "rank %d\n%s" % (rank, report)
    # The shutdown time, then each survivor's exit and mpirun's teardown (~2 s here).
    assert ended - float(stopped_at) < shutdown_s + 10, report
    assert not os.path.exists("/proc/%s" % pid) or _is_zombie(int(pid)), \
        "mpirun ended but left the stopped rank (pid %s)\n%s" % (pid, report)


def _is_zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_rank_in_a_native_call_is_named_as_not_submitting(run_mpi):
    """Issue 37 (2): one rank blocked in a native sleep (ctypes) while the others wait: its
    engine still runs, so it is named as not submitting (not as frozen), within the check
    time (before: up to the check time plus two probe intervals, and more when MPI missed
    the ping), and the stall shutdown fails every rank's request naming it."""
    run_mpi("frozen_rank", 3, env={"PTEST_FROZEN": "native",
                                   "PERSEUS_STALL_CHECK_TIME_SECONDS": "2",
                                   "PERSEUS_STALL_SHUTDOWN_TIME_SECONDS": "3"}, timeout=60)
