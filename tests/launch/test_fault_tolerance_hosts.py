"""A host lost in the middle of training, under Open MPI 5 with ULFM (issue 46): 4 ranks,
2 on hostA and 2 on hostB (namespace hosts, tests/support/fake_hosts.py), started the way
a user starts them, logged in on hostA: `perseusrun --elastic -H hostA:2,hostB:2 ...`
(mpirun --with-ft ulfm, whose daemon on hostB the agent that plays ssh starts).

tests/rank_scripts/elastic_shrink.py trains; hostB's ranks (2 and 3) pause before the
allreduce of step 5 (PTEST_SIGNAL=PAUSE), hostA's wait inside it, and the test then
- kills hostB: SIGKILL to every process in its network namespace, both ranks and
  Open MPI's daemon (prted) there;
- or cuts hostB's link (its eth0 down) and lets its ranks go on into the allreduce.

Open MPI 5.0's runtime (PRRTE 3.0.11) ends the whole job when it loses a host's daemon,
ULFM or not, so hostA's ranks cannot go on in place (docs/elastic.md, "A host lost").
perseusrun then blacklists hostB and starts the job again on hostA's 2 slots, where
hvd.elastic.run resumes from the last persisted commit (--min-np 2: the killed host);
without --min-np (Horovod's default, -np: 4) the hosts left are too few, and perseusrun
ends with 69, naming hostB (the cut link). Both within seconds, never a hang. If a test
fails because "survivor ok" appears, Open MPI keeps the job now, and the shrink is worth
testing.

The core is the ULFM build of tests/mpi/test_fault_tolerance.py's `ulfm` fixture.

Without ULFM (the MPICH core, the .venv's), a rank that dies ends the job (Hydra), and
`perseusrun --elastic -H hostA:2,hostB:2 --min-np 2` restarts it without the host that
lost the rank: test_rank_killed_restarts_on_the_hosts_left_mpich.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.jobs import RANK_SCRIPTS, REPO_ROOT, TESTS_DIR, clean_env, run_bounded

sys.path.insert(0, str(TESTS_DIR / "mpi"))  # the ulfm fixture's module
from test_fault_tolerance import ulfm  # noqa: F401,E402 - a fixture: the Open MPI 5 (ULFM) core
from test_multi_host import user_env  # noqa: E402

from perseus.common import elastic  # noqa: E402
from perseus.common.exceptions import HorovodInternalError  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(400)]

HOSTB_RANKS = (2, 3)
PAUSE_STEP = 5
# PRRTE's words when it gives up a daemon: its ssh session ended (the host killed) ...
DAEMON_GONE = "A daemon failed to report back after being spawned"
# ... or its TCP connection failed (the keepalive, on a cut link).
DAEMON_UNREACHABLE = "PRTE has lost communication with a remote daemon"
# mpirun's exit code was 0 all the same: perseusrun says so and ends with this one.
HOST_LOST_EXIT = 69
HOST_LOST_SAID = "perseusrun: Open MPI ended the job after losing host hostB ("


def assert_host_lost_said(rc, text, report):
    """perseusrun ends non-zero, naming hostB, where mpirun ended with 0 (a silent failure
    to a scheduler before)."""
    assert rc == HOST_LOST_EXIT, report
    assert HOST_LOST_SAID in text and "; exit code %d" % HOST_LOST_EXIT in text, report


def when_paused(scratch, action, done, timeout):
    """A thread: once hostB's ranks have paused, `action()`, then lets them go on.
    done["at"]: when the action was taken (monotonic); done["error"]: what failed."""
    def watch():
        deadline = time.monotonic() + timeout
        try:
            while not all((scratch / ("paused.%d" % r)).exists() for r in HOSTB_RANKS):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)
            action()
            done["at"] = time.monotonic()
        except Exception as e:  # reported by the test
            done["error"] = repr(e)
        finally:
            (scratch / "go").write_text("")
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def perseusrun_env(hosts, ulfm, scratch, extra=None):  # noqa: F811 - the fixture
    """hostA's user environment for the ULFM core: the package on PYTHONPATH, the agent as
    PRRTE's ssh (Open MPI 5's launcher reads plm_ssh_agent under its own prefix)."""
    return user_env(hosts, scratch, dict(extra or {}, PRTE_MCA_plm_ssh_agent=str(hosts.agent),
                                         PYTHONPATH=ulfm["env"]["PYTHONPATH"],
                                         PERSEUS_ELASTIC_PERSIST_DIR=str(scratch / "commits")))


def perseusrun_argv(ulfm, env, *flags):  # noqa: F811 - the fixture
    python = str(ulfm["python"])
    forward = [arg for name in sorted(env) if name.startswith("PTEST_") for arg in ("-x", name)]
    # -P: the package on PYTHONPATH (the ULFM core), not this checkout's perseus/.
    return ([python, "-P", "-m", "perseus.launcher", "--elastic", "-H", "hostA:2,hostB:2",
             "--mpirun", str(Path(python).parent / "mpirun")] + list(flags) + forward
            + [python, str(RANK_SCRIPTS / "elastic_shrink.py")])


def run_losing_host_b(hosts, ulfm, scratch, action, flags=(), extra=None,  # noqa: F811
                      timeout=90):
    """perseusrun --elastic at np 4 on hostA:2,hostB:2 (and `flags`, and the variables
    `extra`), typed on hostA, with `action` taken on hostB once its ranks paused -> (rc,
    out + err, seconds from the action to the end, report). Whatever of the job outlives
    it is killed."""
    env = perseusrun_env(hosts, ulfm, scratch, dict(extra or {}, **{
        "PTEST_KILL_WHERE": "allreduce", "PTEST_KILL_STEP": str(PAUSE_STEP),
        "PTEST_VICTIMS": ",".join(map(str, HOSTB_RANKS)), "PTEST_SIGNAL": "PAUSE",
        # hostA's ranks may see hostB's die and shrink in place before PRRTE ends the job
        # (within seconds); they then trained on, as far as the load let them (up to step
        # 22 of 24 once), and might finish. Held in their reset callback, they leave the
        # last commit at step 5 whatever the load.
        "PTEST_HOLD_AFTER_RESET_S": str(timeout // 2),
        "PTEST_HANG_DUMP_S": str(timeout - 15)}))
    done = {}
    watcher = when_paused(scratch, action, done, timeout)
    try:
        rc, out, err, seconds = run_bounded(
            hosts.command("hostA", perseusrun_argv(ulfm, env, *flags), env, cwd=REPO_ROOT),
            os.environ, timeout)
        ended = time.monotonic()
    finally:
        watcher.join(timeout=5)
        (scratch / "go").write_text("")
        # What mpirun left behind, given 10 s to end (a rank told to stop leaves within 3 s
        # of SIGTERM: common/fatal_signals.h).
        deadline = time.monotonic() + 10
        while True:
            left = {host: hosts.pids_on(host, str(RANK_SCRIPTS / "elastic_shrink.py"))
                    + hosts.pids_on(host, "prted") for host in ("hostA", "hostB")}
            if not left["hostA"] + left["hostB"] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for pid in left["hostA"] + left["hostB"]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    after = ended - done["at"] if "at" in done else None
    report = ("rc %d after %.1f s, %s s after the action (%s); left running: %s\n"
              "----- stdout -----\n%s\n----- stderr -----\n%s" % (
                  rc, seconds, after and "%.1f" % after, done.get("error", "no error in it"),
                  left, out, err[-20000:]))
    assert "at" in done, "hostB's ranks never paused at step %d\n%s" % (PAUSE_STEP, report)
    return rc, out + err, after, left, report


def kill_host_b(hosts):
    """SIGKILL to every process of hostB: its ranks and Open MPI's daemon (prted)."""
    for pid in hosts.pids_on("hostB"):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_host_killed_restarts_on_the_hosts_left(hosts, ulfm, tmp_path):  # noqa: F811
    """Every process of hostB SIGKILLed mid-step (its ranks and Open MPI's daemon): PRRTE
    sees the daemon's ssh session end and its connection drop, and ends the job within
    seconds ("Comm failure: daemon ... - aborting" with errmgr_base_verbose), killing
    hostA's ranks, shrunk in place or not (held in their reset callback here); mpirun's
    exit code is PRRTE's (0 here). perseusrun
    (--min-np 2) blacklists hostB and starts the job again on hostA's 2 slots; there
    hvd.elastic.run resumes from the commit of step 5 (the last before the kill, persisted)
    and both ranks finish with the script's checks (identical parameters, the loss fell,
    each step once, no committed sample trained again nor any skipped). Exit code 0."""
    rc, text, after, left, report = run_losing_host_b(
        hosts, ulfm, tmp_path, lambda: kill_host_b(hosts), flags=("--min-np", "2"))
    assert ((DAEMON_GONE in text and "Remote host:   hostB" in text)
            or (DAEMON_UNREACHABLE in text and "on node hostB" in text)), report
    assert rc == 0, report
    for said in ("perseusrun: --elastic: host hostB was lost (Open MPI lost its daemon): "
                 "blacklisted for the rest of the job (Horovod's cooldown)",
                 "perseusrun: --elastic: Open MPI ended the job after losing host hostB: "
                 "restarting the job (restart 1 of at most 3, --reset-limit)",
                 "perseusrun: --elastic: starting 2 rank(s) on hostA:2 (run 1)",
                 "restart 1: resuming from persisted commit %d on 2 rank(s)" % PAUSE_STEP,
                 "run 1 started at step %d epoch 0" % PAUSE_STEP):
        assert said in text, report
    assert text.count("restarted ok, size 2") == 2, report
    assert "survivor ok" not in text and HOST_LOST_SAID not in text, report
    assert after < 60, report
    assert not list((tmp_path / "commits").glob("commit.*")), report  # removed when done
    assert not left["hostA"] + left["hostB"], report


def test_link_cut_ends_the_job_within_seconds(hosts, ulfm, tmp_path):  # noqa: F811
    """hostB's eth0 down mid-step, its ranks going on into the allreduce they can no
    longer reach. PRRTE notices the silent daemon only by TCP keepalive, which perseusrun
    --elastic sets to 5 s + 5 x 1 s (launcher.ULFM_KEEPALIVE; the user's values win: 2 s
    + 2 x 1 s here, to spare CI 6 s; the defaults reach mpirun as the dry run below
    checks), and ends the job, naming hostB. Before, mpirun kept the job for 300 + 9 x
    20 s (PRRTE's default keepalive) while hostA's ranks looped in hvd.elastic.run; with
    a shorter peer timeout, hostA's ranks ended first and mpirun hung (its message to
    hostB unacknowledged, no keepalive). mpirun's exit code is 0. hostB is blacklisted,
    but hostA's 2 slots are below --min-np (Horovod's default: -np, 4) and no cooldown
    can bring hostB back: perseusrun cannot restart the job, and ends with
    HOST_LOST_EXIT, naming hostB."""
    try:
        rc, text, after, left, report = run_losing_host_b(
            hosts, ulfm, tmp_path, lambda: hosts.link("hostB", False), extra={
                "PRTE_MCA_oob_tcp_keepalive_time": "2", "PRTE_MCA_oob_tcp_keepalive_intvl": "1",
                "PRTE_MCA_oob_tcp_keepalive_probes": "2"})
    finally:
        hosts.link("hostB", True)
    assert after < 12, report
    assert DAEMON_UNREACHABLE in text and "on node hostB" in text, report
    assert ("blacklisted: hostB (for the rest of the job)), fewer than --min-np 4, and no "
            "wait can bring enough back") in text, report
    assert_host_lost_said(rc, text, report)
    assert "survivor ok" not in text and "(run 1)" not in text, report
    assert not left["hostA"] + left["hostB"], report


def test_perseusrun_elastic_sets_the_keepalive_unless_given(hosts, ulfm, tmp_path):  # noqa: F811
    """The keepalive goes to mpirun's environment (PRRTE hands PRTE_MCA_* to its daemons);
    a value the user set is kept."""
    for given, want in ((None, "PRTE_MCA_oob_tcp_keepalive_time=5"),
                        ("30", "PRTE_MCA_oob_tcp_keepalive_time=30")):
        env = perseusrun_env(hosts, ulfm, tmp_path)
        if given:
            env["PRTE_MCA_oob_tcp_keepalive_time"] = given
        res = subprocess.run(perseusrun_argv(ulfm, env, "--dry-run"), env=clean_env(env),
                             capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
        assert res.returncode == 0, res.stdout + res.stderr
        assert (want in res.stdout) == (given is None), res.stdout
        assert "PRTE_MCA_oob_tcp_keepalive_probes=5" in res.stdout, res.stdout


def test_frozen_host_is_left_behind_and_its_ranks_ended(hosts, ulfm, tmp_path):  # noqa: F811
    """Both of hostB's ranks stop (SIGSTOP) before step 5's allreduce: no survivor shares
    their host to end them. Open MPI's heartbeat detector (3.5 s here) declares them
    failed, hostA's two ranks shrink in place and finish with the script's checks, and
    the first of them asks Open MPI's runtime to end the stopped processes
    (runtime_processes.cc), so that they cannot rejoin and mpirun ends: exit code 0,
    nothing left on hostB. Before, mpirun waited for them at the end for good."""
    detector = {"OMPI_MCA_mpi_ft_detector": "true", "OMPI_MCA_mpi_ft_detector_period": "1",
                "OMPI_MCA_mpi_ft_detector_timeout": "3.5"}
    env = perseusrun_env(hosts, ulfm, tmp_path, dict(detector, **{
        "PTEST_KILL_WHERE": "allreduce", "PTEST_KILL_STEP": str(PAUSE_STEP),
        "PTEST_VICTIMS": ",".join(map(str, HOSTB_RANKS)), "PTEST_SIGNAL": "SIGSTOP",
        "PERSEUS_PEER_TIMEOUT_SECONDS": "120", "PTEST_HANG_DUMP_S": "45"}))
    forward = [arg for name in sorted(detector) for arg in ("-x", name)]
    argv = perseusrun_argv(ulfm, env, "--min-np", "2", *forward)
    try:
        rc, out, err, seconds = run_bounded(hosts.command("hostA", argv, env, cwd=REPO_ROOT),
                                            os.environ, 60)
    finally:
        left = {host: hosts.pids_on(host, str(RANK_SCRIPTS / "elastic_shrink.py"))
                for host in ("hostA", "hostB")}
        for pid in hosts.pids_on("hostB", str(RANK_SCRIPTS / "elastic_shrink.py")):
            os.kill(pid, signal.SIGKILL)
    report = "rc %d after %.1f s; left: %s\n%s\n%s" % (rc, seconds, left, out, err[-20000:])
    assert rc == 0, report
    assert out.count("survivor ok, size 2") == 2, report
    for rank in HOSTB_RANKS:
        assert out.count("frozen rank %d was ended" % rank) == 2, report
    assert not left["hostA"] + left["hostB"], report


class _Broken:
    """A state whose sync always fails, as on a world whose peer the engine gave up."""

    def __init__(self):
        self.syncs = self.restores = 0

    def sync(self):
        self.syncs += 1
        raise HorovodInternalError("Perseus stopped process set 0 at the peer timeout")

    def restore(self):
        self.restores += 1

    def on_reset(self):
        pass


def test_elastic_run_gives_up_a_world_that_cannot_recover(monkeypatch):
    """After a reset, a sync that fails again on the same world (no rank failed under
    ULFM) ends hvd.elastic.run with the error, instead of trying forever (a cut link's
    survivors did, at the peer timeout)."""
    monkeypatch.setattr(elastic, "_said_mode", True)
    state = _Broken()
    with pytest.raises(HorovodInternalError, match="cannot go on.*peer timeout"):
        elastic.run_fn(lambda s: None, reset_fn=lambda: None)(state)
    assert (state.syncs, state.restores) == (2, 1)


class _Plain:
    """A state whose sync and restore always work."""

    def sync(self):
        pass

    def restore(self):
        pass

    def on_reset(self):
        pass


def test_elastic_run_takes_rank_0s_commit_counts_after_a_reset(monkeypatch):
    """After a reset every rank takes rank 0's count of commits (one broadcast): a failure
    the others survive in place may catch them on either side of a commit, and with
    PERSEUS_ELASTIC_PERSIST_INTERVAL above 1 they must still persist the same commits,
    whose gather of the samplers' records needs every rank (-H under ULFM persists)."""
    monkeypatch.setattr(elastic, "_said_mode", True)
    monkeypatch.delenv("PERSEUS_ELASTIC_RUN_ID", raising=False)
    sent = []
    persister = elastic._Persister.__new__(elastic._Persister)
    persister.commits, persister.persisted = 7, 6  # this rank passed commit 7, rank 0 not
    persister._broadcast = lambda value, root_rank: sent.append((value, root_rank)) or (6, 6)
    state = _Plain()
    state._persister = persister
    calls = []

    def train(state):
        calls.append(len(calls))
        if len(calls) == 1:
            raise HorovodInternalError("rank 3 failed")

    elastic.run_fn(train, reset_fn=lambda: None)(state)
    assert calls == [0, 1] and sent == [((7, 6), 0)], (calls, sent)
    assert (persister.commits, persister.persisted) == (6, 6)


# ------------------------------------------------- without ULFM: the MPICH core restarts

def run_mpich_losing_a_rank(hosts, scratch, extra, timeout=90):
    """`perseusrun --elastic -H hostA:2,hostB:2 --min-np 2 python elastic_shrink.py` on the
    MPICH core (the .venv's: no ULFM), typed on hostA, with the variables `extra` -> (rc,
    out + err, report). What outlives it is killed, and fails the test."""
    env = user_env(hosts, scratch, dict(extra, PTEST_HANG_DUMP_S=str(timeout - 15),
                                        PERSEUS_ELASTIC_PERSIST_DIR=str(scratch / "commits")))
    argv = ["perseusrun", "--elastic", "-H", "hostA:2,hostB:2", "--min-np", "2", "python",
            str(RANK_SCRIPTS / "elastic_shrink.py")]
    try:
        rc, out, err, seconds = run_bounded(hosts.command("hostA", argv, env, cwd=REPO_ROOT),
                                            os.environ, timeout)
    finally:
        left = {host: hosts.pids_on(host, str(RANK_SCRIPTS / "elastic_shrink.py"))
                for host in ("hostA", "hostB")}
        for pid in left["hostA"] + left["hostB"]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    report = "rc %d after %.1f s; left running: %s\n----- stdout -----\n%s\n" \
             "----- stderr -----\n%s" % (rc, seconds, left, out, err[-20000:])
    print("job: %.1f s" % seconds)
    assert not left["hostA"] + left["hostB"], report
    return rc, out + err, report


def test_rank_killed_restarts_on_the_hosts_left_mpich(hosts, tmp_path):
    """The MPICH core (no ULFM), `perseusrun --elastic -H hostA:2,hostB:2 --min-np 2`
    typed on hostA: rank 3, on hostB, SIGKILLs itself before the allreduce of step 5
    (elastic_shrink.py, PTEST_KILL_WHERE=allreduce), the others inside it. Hydra ends the
    job, naming hostB in its banner ("RUNNING AT hostB"); its mpiexec exits with 9 or, in
    4 runs of 5 here, with 255 (a proxy failing on the way out: "assert (!closed)
    failed"), which perseusrun took for a failure of the script before: "not restarted".
    perseusrun blacklists hostB and starts the job again on hostA's 2 slots, where
    hvd.elastic.run resumes from the persisted commit of step 5 and both ranks finish
    with the script's checks (identical parameters, the loss fell, each step once, no
    committed sample trained again nor any skipped). Exit code 0, the commit removed."""
    rc, text, report = run_mpich_losing_a_rank(hosts, tmp_path, {
        "PTEST_KILL_WHERE": "allreduce", "PTEST_KILL_STEP": str(PAUSE_STEP),
        "PTEST_VICTIMS": "3"})
    assert "RUNNING AT hostB" in text, report
    assert rc == 0, report
    for said in ("perseusrun: --elastic: host hostB lost a rank: blacklisted for the rest "
                 "of the job (Horovod's cooldown)",
                 "restarting the job (restart 1 of at most 3, --reset-limit)",
                 "perseusrun: --elastic: starting 2 rank(s) on hostA:2 (run 1)",
                 "restart 1: resuming from persisted commit %d on 2 rank(s)" % PAUSE_STEP,
                 "run 1 started at step %d epoch 0" % PAUSE_STEP):
        assert said in text, report
    assert text.count("restarted ok, size 2") == 2 and "(run 2)" not in text, report
    assert not list((tmp_path / "commits").glob("commit.*")), report  # removed when done


def test_host_killed_whole_restarts_mpich(hosts, tmp_path):
    """The MPICH core, `perseusrun --elastic -H hostA:2,hostB:2 --min-np 2`: every process
    of hostB (its ranks and Hydra's proxy) SIGKILLed mid-step. Hydra's mpiexec names no
    host ("control_cb (...): assert (!closed) failed", exit code 255); perseusrun asks
    each host through Hydra's launch agent whether it answers: hostB does (only its
    processes died), so the job starts again on the same hosts, where hvd.elastic.run
    resumes from the persisted commit of step 5 and the 4 ranks finish with the script's
    checks. Before, perseusrun ended with 255, 'not restarted'. (A host that does not
    answer is blacklisted: test_launcher_elastic's stand-in agent.)"""
    done = {}
    watcher = when_paused(tmp_path, lambda: kill_host_b(hosts), done, 60)
    try:
        rc, text, report = run_mpich_losing_a_rank(hosts, tmp_path, {
            "PTEST_KILL_WHERE": "allreduce", "PTEST_KILL_STEP": str(PAUSE_STEP),
            "PTEST_VICTIMS": ",".join(map(str, HOSTB_RANKS)), "PTEST_SIGNAL": "PAUSE"})
    finally:
        watcher.join(timeout=5)
    assert "at" in done, report
    assert "assert (!closed) failed" in text, report
    assert rc == 0, report
    for said in ("perseusrun: --elastic: Hydra lost a host's proxy, naming no host (every "
                 "host answers: the same hosts again): restarting the job (restart 1 of at "
                 "most 3, --reset-limit)",
                 "perseusrun: --elastic: starting 4 rank(s) on hostA:2,hostB:2 (run 1)",
                 "restart 1: resuming from persisted commit %d on 4 rank(s)" % PAUSE_STEP):
        assert said in text, report
    assert text.count("restarted ok, size 4") == 4 and "(Horovod's cooldown)" not in text, report

