"""A lost rank costs a step, not the job (issue 46): Open MPI 5 with ULFM.

The core is built against pip's Open MPI 5 wheel (in .venv-ompi5, which
scripts/setup.sh --all makes; the build is cached, build_support/other_mpi_core.py) and run
with `mpirun --with-ft ulfm` at np 4. tests/rank_scripts/elastic_shrink.py trains with
hvd.elastic.run; ranks SIGKILL themselves (real processes, real signals) at a chosen
step and place, and the survivors must recover in place and finish, their parameters
identical to the bit, the loss falling, and no sample skipped or trained on again
across the failure (the script checks). mpirun must end the job with exit code 0.
Under perseusrun's --min-np, survivors fewer than it stop for a restart (a discovery
script) or fail (this machine alone): the test_below_min_np_* tests.
PERSEUS_SKIP_OMPI5=1 skips these tests on purpose.

Where the MPI has no ULFM (the MPICH core of .venv), `perseusrun --elastic` restarts the
job after a rank is killed and hvd.elastic.run resumes from the last persisted commit
(tests/rank_scripts/elastic_restart.py), and with --host-discovery-script the job
follows its hosts, 2 -> 4 ranks and 4 -> 2, restarting at a commit: the last tests here.
"""
import os
import stat
import subprocess
import sys

import pytest

from support.jobs import REPO_ROOT, RANK_SCRIPTS, clean_env, find_mpirun, framework_python
from support.jobs import run_bounded
from support.jobs import BUILD_SUPPORT  # noqa: F401 - puts build_support/ on sys.path
from other_mpi_core import build_core, package

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(900)]

NP = 4


@pytest.fixture(scope="module")
def ulfm(tmp_path_factory):
    """{"python": .venv-ompi5's python, "launcher": its mpirun with ULFM on, "env": the
    PYTHONPATH of a perseus package whose core is the Open MPI 5 build}."""
    python = framework_python("Open MPI 5 (ULFM)", "ompi5", "setup_ompi5.sh")
    bin_dir = python.parent
    core = build_core("open_mpi5_core", str(bin_dir / "mpicxx"))
    # Open MPI refuses root and more ranks than cores unless told, and wants an rsh agent
    # that exists even for a launch on one host, where it is never called.
    launcher = [str(bin_dir / "mpirun"), "--with-ft", "ulfm", "--allow-run-as-root",
                "--oversubscribe", "--mca", "plm_rsh_agent", "false"]
    return {"python": python, "launcher": launcher,
            "env": {"PYTHONPATH": package(core, tmp_path_factory.mktemp("ompi5"))}}


def test_second_failure_during_recovery(ulfm, run_mpi):
    """Issue 46: rank 3 dies inside the step's allreduce, then rank 1 inside the state
    sync that follows (a second failure during recovery): ranks 0 and 2 recover again
    and finish, with the script's checks (identical parameters, falling loss, no sample
    skipped)."""
    env = dict(ulfm["env"], PTEST_KILL_WHERE="allreduce", PTEST_KILL_STEP="5",
               PTEST_VICTIMS="3", PTEST_RECOVERY_VICTIM="1")
    out = run_mpi("elastic_shrink", NP, env=env, python=ulfm["python"],
                  launcher=ulfm["launcher"], timeout=240)
    assert out.count("survivor ok, size 2") == 2, out


@pytest.mark.parametrize("where,step,victims", [
    ("allreduce", 5, "3"),      # the last rank, as the others reduce the step's gradients
    ("broadcast", 6, "0"),      # rank 0, as it broadcasts: the new rank 0 syncs the state
    ("allgather", 7, "2"),
    ("set", 5, "3"),            # inside a collective of a process set (added again after)
    ("commit", 4, "1,2"),       # two ranks at once, during commit()
])
def test_survivors_recover_in_place(ulfm, run_mpi, where, step, victims):
    """Ranks SIGKILLed where and when the parameters say: the survivors recover in place
    and finish (the script's checks). perseusrun's --min-np is the survivors' number
    (PERSEUS_ELASTIC_MIN_NP, as perseusrun passes it): a shrink to exactly --min-np goes
    on as without it."""
    survivors = NP - len(victims.split(","))
    env = dict(ulfm["env"], PTEST_KILL_WHERE=where, PTEST_KILL_STEP=str(step),
               PTEST_VICTIMS=victims, PERSEUS_ELASTIC_MIN_NP=str(survivors))
    out = run_mpi("elastic_shrink", NP, env=env, python=ulfm["python"],
                  launcher=ulfm["launcher"], timeout=240)
    assert out.count("survivor ok, size %d" % survivors) == survivors, out


def perseusrun_ulfm(ulfm, tmp_path, flags, victims, limit_s=120):
    """elastic_shrink.py at np 4 under `perseusrun --elastic --min-np 3 <flags>` on the ULFM
    core, `victims` SIGKILLed before step 5's allreduce -> (rc, stdout, stderr, report)."""
    python = str(ulfm["python"])
    env = clean_env(dict(ulfm["env"], PTEST_KILL_WHERE="allreduce", PTEST_KILL_STEP="5",
                         PTEST_VICTIMS=victims, PTEST_TMPDIR=str(tmp_path),
                         PERSEUS_ELASTIC_PERSIST_DIR=str(tmp_path / "commits")))
    # -P: `perseus` from PYTHONPATH (the Open MPI 5 build), not this checkout's.
    cmd = ([python, "-P", "-m", "perseus.launcher", "--elastic", "--mpirun", ulfm["launcher"][0],
            "--min-np", "3"] + flags + [python, str(RANK_SCRIPTS / "elastic_shrink.py")])
    rc, out, err, seconds = run_bounded(cmd, env, limit_s)
    return rc, out, err, "rc %d after %.1f s\nstdout:\n%s\nstderr:\n%s" % (
        rc, seconds, out, err[-8000:])


def test_below_min_np_in_place_the_job_fails_saying_so(ulfm, tmp_path):
    """perseusrun --elastic -np 4 --min-np 3 (this machine alone: nothing can add ranks),
    ranks 2 and 3 SIGKILLed: the two survivors do not train on (before, they finished
    with 2, exit code 0); each raises BelowMinNpError naming --min-np, the size left and
    what to do, rank 0 says it, and the job ends with exit code 1, at once."""
    rc, out, err, report = perseusrun_ulfm(ulfm, tmp_path, ["-np", str(NP)], "2,3")
    assert rc == 1, report
    said = ("hvd.elastic.run cannot go on: 2 rank(s) left after a failure, fewer than --min-np 3, "
            "and nothing can add ranks to this job")
    assert err.count("BelowMinNpError: " + said) == 2, report
    assert "[perseus] hvd.elastic: " + said in err and "lower --min-np" in err, report
    assert "survivor ok" not in out, report


def test_below_min_np_the_ranks_stop_and_perseusrun_restarts(ulfm, tmp_path):
    """perseusrun --elastic --host-discovery-script (localhost:4) --min-np 3, ranks 2 and 3
    SIGKILLed before step 5's allreduce: the two survivors shrink, see they are fewer than
    --min-np, persist the restored commit (step 5) and stop with exit code 76; perseusrun
    starts the job again on the 4 slots the script offers, which resumes from that commit
    and finishes with the script's checks (identical parameters, the loss fell, no sample
    skipped or trained again after the commit), exit code 0. Before, the two trained on
    to the end."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:4\n")
    rc, out, err, report = perseusrun_ulfm(ulfm, tmp_path, [
        "--host-discovery-script", "cat %s" % hosts], "2,3")
    assert rc == 0, report
    assert ("[perseus] hvd.elastic: 2 rank(s) left after a failure, fewer than --min-np 3: "
            "commit 5 is persisted; the ranks stop here (exit code 76)") in err, report
    assert out.count("stopped below --min-np at step 5") == 2, report
    assert ("the ranks left after a failure were fewer than --min-np 3 and stopped at their "
            "last commit: restarting the job (restart 1 of at most 3") in err, report
    assert "starting 4 rank(s) on localhost:4 (run 1)" in err, report
    assert "restart 1: resuming from persisted commit 5 on 4 rank(s)" in err, report
    assert "run 1 started at step 5 epoch 0" in out, report
    assert out.count("restarted ok, size 4") == NP and "survivor ok" not in out, report


def test_frozen_rank_is_ended_and_left_behind(ulfm, run_mpi):
    """Issue 46, point 2: rank 3 stops (SIGSTOP) before the step's allreduce. At the peer
    timeout (5 s, before the heartbeat detector the core arms, which waits at least 10 s)
    the survivors, which share its host, end it (SIGKILL: it cannot rejoin when it
    wakes), and go on as for a dead rank: identical parameters, falling loss, no sample
    skipped, the frozen process gone (the script checks). Before, the survivors' reset
    waited for it for good."""
    env = dict(ulfm["env"], PTEST_KILL_WHERE="allreduce", PTEST_KILL_STEP="5",
               PTEST_VICTIMS="3", PTEST_SIGNAL="SIGSTOP", PERSEUS_PEER_TIMEOUT_SECONDS="5")
    out = run_mpi("elastic_shrink", NP, env=env, python=ulfm["python"],
                  launcher=ulfm["launcher"], timeout=240)
    assert out.count("survivor ok, size 3") == 3, out
    assert out.count("frozen rank 3 was ended") == 3, out
    assert out.count("detector: Open MPI's heartbeat detector declares a rank that is "
                     "silent for 10 s failed") == NP, out


def test_frozen_rank_is_declared_failed_by_the_heartbeat_detector(ulfm, run_mpi):
    """Issue 46, point 2, where no survivor would end the frozen rank in time (alone on
    its host; here the peer timeout is 60 s, past the test's bound): Open MPI's heartbeat
    detector (3.5 s) declares rank 3, SIGSTOPped before step 5's allreduce, failed, and
    the survivors go on as for a dead rank, the first of them on its host ending it
    after the shrink. Before it, rank 1 computes 8 s outside MPI at step 2, its engine
    idle, while the others wait in the allreduce: the core's heartbeat pump keeps it from
    being declared failed (without the pump Open MPI aborts it: "I have been reported
    dead"; with one MPI call a beat, which runs Open MPI's event loop one beat in 8,
    heartbeats went 4 s apart, past the 3.5 s)."""
    env = dict(ulfm["env"], PTEST_KILL_WHERE="allreduce", PTEST_KILL_STEP="5",
               PTEST_VICTIMS="3", PTEST_SIGNAL="SIGSTOP", PERSEUS_PEER_TIMEOUT_SECONDS="60",
               PTEST_BUSY="1:2:8", OMPI_MCA_mpi_ft_detector="true",
               OMPI_MCA_mpi_ft_detector_period="1", OMPI_MCA_mpi_ft_detector_timeout="3.5")
    out = run_mpi("elastic_shrink", NP, env=env, python=ulfm["python"],
                  launcher=ulfm["launcher"], timeout=55)
    assert out.count("survivor ok, size 3") == 3, out
    assert out.count("frozen rank 3 was ended") == 3, out
    assert "reported dead" not in out, out


@pytest.fixture(scope="module")
def fake_gpu_ompi5(ulfm, tmp_path_factory):
    """The fake CUDA runtime and NCCL (tests/gpu_fakes) built against Open MPI 5, whose
    MPI_COMM_WORLD its communicators run over (the suite's fake_gpu is MPICH's)."""
    from support import fake_gpu as fake
    folder = tmp_path_factory.mktemp("fake_gpu_ompi5")
    library = fake.build(str(ulfm["python"].parent / "mpicc"), folder)
    return {"PERSEUS_CUDA_LIB": str(folder), "PERSEUS_NCCL_LIB": str(folder),
            "FAKE_GPU_LIB": library, "FAKE_GPU_DEVICE_DIR": str(folder)}


def test_gpu_survivors_abort_nccl_and_recover(ulfm, fake_gpu_ompi5, run_mpi):
    """Issue 46, point 5: rank 3 is SIGKILLed as its 5th ncclAllReduce starts (the fake
    NCCL kills it), the other three inside the same kernel waiting for it, which never
    completes until its communicator is aborted (as on a real GPU). The survivors raise
    HorovodInternalError, abort their lanes' NCCL communicators, recover through
    hvd.elastic.run with new communicators over the three, and finish the steps, each
    result and the committed total checked against numpy (tests/rank_scripts/gpu_elastic.py),
    with no misuse of the fake (ncclCommDestroy of a broken communicator, a call on an
    aborted one). FAKE_GPU_DEVICE_TIMEOUT_S bounds a kernel nobody aborts (a failure)."""
    env = dict(ulfm["env"], **fake_gpu_ompi5, FAKE_NCCL_DIE_RANK="3", FAKE_NCCL_DIE_AT_ALLREDUCE="5",
               FAKE_GPU_DEVICE_TIMEOUT_S="30")
    out = run_mpi("gpu_elastic", NP, env=env, python=ulfm["python"], launcher=ulfm["launcher"], timeout=120)
    assert out.count("gpu survivor ok, size 3") == 3, out


def test_gpu_survivors_of_deaths_in_nccl_creation_and_messages(ulfm, fake_gpu_ompi5, run_mpi):
    """Issue 46, point 5, the rest of the GPU lanes, two failures in one job (np 4): rank 3
    is SIGKILLed as it starts making its device lane's NCCL communicator (the job's first
    GPU batch), the other three inside the creation, which never completes while a peer
    is missing; then, over the three, each step also sends a CUDA tensor round the ring
    (a communicator per pair), and rank 2 is SIGKILLed as its 5th ncclSend starts (step
    2), its peers inside the calls that match it. Each time the survivors raise
    HorovodInternalError, abort the half-made or the pairs' communicators, and go on:
    ranks 0 and 1 finish every step, each result (the allreduce's, every message's) and
    the committed total checked against numpy, with no misuse of the fake (a call on a
    communicator whose creation is in progress, one left unaborted)."""
    env = dict(ulfm["env"], **fake_gpu_ompi5, FAKE_NCCL_DIE_AT_INIT="3:1", PTEST_GPU_P2P="1",
               FAKE_NCCL_DIE_AT_P2P="2:5", PTEST_FAILURES="2", FAKE_GPU_DEVICE_TIMEOUT_S="30")
    out = run_mpi("gpu_elastic", NP, env=env, python=ulfm["python"], launcher=ulfm["launcher"], timeout=120)
    assert out.count("gpu survivor ok, size 2") == 2, out


CHECK = """
import perseus.common.basics as b
enabled, why = b.fault_tolerance()
print(enabled, why)
"""


def test_the_mode_and_its_reason(ulfm):
    """init() and --check-build can say whether a job outlives a rank, and why: the
    MPICH core never; the ULFM core only when mpirun started it with ULFM."""
    plain = subprocess.run([sys.executable, "-c", CHECK], cwd=str(REPO_ROOT), env=clean_env(),
                           capture_output=True, text=True, timeout=60)
    assert plain.stdout.startswith("False the MPI this core was built with has no ULFM"), \
        plain.stdout + plain.stderr
    for launcher, expected in ((ulfm["launcher"], "True the core's MPI has ULFM and this job "
                                                  "was started with it"),
                               ([x for x in ulfm["launcher"] if x not in ("--with-ft", "ulfm")],
                                "False its MPI has ULFM, but this job was not started with it")):
        # -P: `perseus` from PYTHONPATH (the Open MPI 5 build), not this checkout.
        result = subprocess.run(launcher + ["-np", "1", str(ulfm["python"]), "-P", "-c", CHECK],
                                cwd=str(REPO_ROOT), env=clean_env(ulfm["env"]),
                                capture_output=True, text=True, timeout=120)
        assert result.stdout.startswith(expected), result.stdout + result.stderr


def final_accuracy(output):
    """train_digits.py's "Final test accuracy: 94.15% on 3 rank(s)" -> (94.15, 3)."""
    line = [l for l in output.splitlines() if l.startswith("Final test accuracy:")][-1]
    words = line.split()
    return float(words[3].rstrip("%")), int(words[5])


def test_elastic_demo_loses_a_rank_and_reaches_the_accuracy(ulfm):
    """Issue 46: the README's one command, scripts/elastic_demo.sh (here 6 epochs): the
    main job at np 4 on Open MPI 5, rank 3 SIGKILLed in epoch 2; the other three go on
    from their last commit, end with identical weights and reach, within 2 points, the
    accuracy of the same training at np 4 with nothing lost (94.15 % both, here)."""
    rc, out, err, _ = run_bounded(["bash", "scripts/elastic_demo.sh", "--epochs", "6"],
                                  clean_env(), 300)
    report = "rc %d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err[-4000:])
    assert rc == 0, report
    assert "A rank failed: going on with 3 rank(s)" in out, report
    assert "Ranks' weights: identical" in out, report
    accuracy, ranks = final_accuracy(out)
    assert ranks == 3, report
    rc, fresh, err, _ = run_bounded([find_mpirun(), "-np", "4", sys.executable,
                                     "examples/pytorch/train_digits.py", "--epochs", "6",
                                     "--checkpoint", ""], clean_env(), 120)
    assert rc == 0, fresh + err
    reference, _ = final_accuracy(fresh)
    assert accuracy >= reference - 2.0, (accuracy, reference, report)



def perseusrun_elastic(*flags):
    """perseusrun --elastic on the MPICH core (no ULFM: it restarts the job), as
    run_mpi's launcher."""
    return [sys.executable, "-m", "perseus.launcher", "--elastic"] + list(flags)


KILL_COMMIT, INTERVAL, STEPS_PER_EPOCH = 10, 2, 6  # elastic_restart.py at np 4: 6 steps an epoch


def test_restart_resumes_from_the_last_persisted_commit(run_mpi, tmp_path):
    """Issue 46: no ULFM. A commit after every step, every 2nd persisted; rank 0 of 4 is
    SIGKILLed in the middle of writing commit 10 (half of it on disk). perseusrun
    --elastic starts the job again, which resumes from commit 8 (step 8, epoch 1: the
    last whole one, not from scratch nor a torn one) and finishes with the script's
    checks (identical parameters, falling loss, no sample of the persisted commit
    trained again or skipped). The finished job's commit file and the torn write are
    removed; the folder is private."""
    commits = tmp_path / "commits"
    env = {"PTEST_RESTART_CASE": "resume", "PTEST_KILL_COMMIT": str(KILL_COMMIT),
           "PERSEUS_ELASTIC_PERSIST_INTERVAL": str(INTERVAL),
           "PERSEUS_ELASTIC_PERSIST_DIR": str(commits)}
    out = run_mpi("elastic_restart", NP, env=env, launcher=perseusrun_elastic(), timeout=240)
    resumed = KILL_COMMIT - INTERVAL
    assert "run 0 started at step 0 epoch 0" in out, out
    assert "run 1 started at step %d epoch %d" % (resumed, resumed // STEPS_PER_EPOCH) in out, out
    assert "run 2" not in out, out
    assert out.count("restart ok: run 1, size %d, %d steps" % (NP, 3 * STEPS_PER_EPOCH)) == NP, out
    assert stat.S_IMODE(os.lstat(commits).st_mode) == 0o700
    assert os.listdir(commits) == [], os.listdir(commits)


def test_restart_limit_ends_the_job_saying_so(tmp_path):
    """A rank that dies in every run: after --reset-limit 1 restart perseusrun gives up,
    saying so, with mpirun's non-zero exit code."""
    env = clean_env({"PTEST_RESTART_CASE": "always", "PTEST_VICTIM": "1",
                     "PTEST_KILL_STEP": "1", "PTEST_TMPDIR": str(tmp_path),
                     "PERSEUS_ELASTIC_PERSIST_DIR": str(tmp_path / "commits")})
    cmd = perseusrun_elastic("--reset-limit", "1") + [
        "-np", "2", sys.executable, str(RANK_SCRIPTS / "elastic_restart.py")]
    rc, out, err, _ = run_bounded(cmd, env, 180)
    report = "rc %d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err)
    assert rc != 0, report
    assert "restarting the job (restart 1 of at most 1, --reset-limit)" in err, report
    assert ("the job was already restarted 1 time(s), the --reset-limit: giving up"
            in err), report
    assert "a rank that fails restarts the job" in err, report  # the mode, said at once
    # Each run resumes: the second from the commit after step 1 (every commit persisted).
    assert "run 0 started at step 0 epoch 0" in out and "run 1 started at step 1 epoch 0" in out, \
        report
    assert "restart 1: resuming from persisted commit 1" in err, report


def test_restart_refuses_a_persist_folder_that_is_a_link(run_mpi, tmp_path):
    """A persist folder that is a symbolic link: hvd.elastic.run refuses it on every
    rank, naming the variable and why."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    env = {"PTEST_RESTART_CASE": "bad_dir",
           "PERSEUS_ELASTIC_PERSIST_DIR": str(link)}
    out = run_mpi("elastic_restart", 2, env=env, launcher=perseusrun_elastic(), timeout=120)
    assert out.count("refused: hvd.elastic.run cannot persist commits") == 2, out
    assert out.count("PERSEUS_ELASTIC_PERSIST_DIR: refusing to use the folder %s: it is a "
                     "symbolic link" % link) == 2, out


def test_the_job_follows_its_hosts(tmp_path):
    """Issue 46, point 3, on the MPICH core (no ULFM): the discovery script's output goes
    from localhost:2 to localhost:4 while the job runs, then back to localhost:2 (rank 0
    writes the file it prints, 3 steps into each run). At each change every rank sees
    HostsUpdatedInterrupt at the same commit and stops; perseusrun starts the job again
    with the new number of ranks (2 -> 4 -> 2), which resumes from that commit (not from
    scratch) and runs the reset callback once at its new size; the last run finishes
    with the script's checks: identical parameters on every rank, a falling loss, no
    sample of the commit trained again nor skipped. One job for both directions: three
    starts instead of four (CI time)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    env = clean_env({"PTEST_RESTART_CASE": "grow", "PTEST_CHANGE_STEP": "3",
                     "PTEST_HOSTS_FILE": str(hosts), "PTEST_NEW_HOSTS": "localhost:4;localhost:2",
                     "PTEST_TMPDIR": str(tmp_path),
                     "PERSEUS_ELASTIC_PERSIST_DIR": str(tmp_path / "commits")})
    cmd = perseusrun_elastic("--host-discovery-script", "cat %s" % hosts, "--min-np", "2",
                             "--max-np", "4") + [
        sys.executable, str(RANK_SCRIPTS / "elastic_restart.py")]
    rc, out, err, _ = run_bounded(cmd, env, 180)
    report = "rc %d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err)
    assert rc == 0, report
    assert ("a rank that fails restarts the job, which resumes from the last persisted commit: "
            "perseusrun --elastic started this job, follows its hosts and restarts it when "
            "they change or a rank dies (restart 0 of at most 3)") in err, report
    start = 0
    for run, (before, after) in enumerate(((2, 4), (4, 2))):
        assert "starting %d rank(s) on localhost:%d (run %d)" % (before, before, run) in err, report
        stopped = [l for l in out.splitlines()
                   if "stopped for new hosts after step" in l and "size %d" % before in l]
        assert len(stopped) == before, report
        steps = {l.split("after step ")[1].split(",")[0] for l in stopped}
        assert len(steps) == 1, report  # every rank at the same commit
        step = int(steps.pop())
        assert step >= start + 3, report
        assert "the hosts changed: commit %d is persisted" % step in err, report
        assert "run %d started at step %d" % (run + 1, step) in out, report
        assert "reset callback at size %d, step %d" % (after, step) in out, report
        start = step
    assert "starting 2 rank(s) on localhost:2 (run 2)" in err, report
    assert out.count("restart ok: run 2, size 2") == 2, report
    assert os.listdir(tmp_path / "commits") == [], os.listdir(tmp_path / "commits")


def test_min_np_not_met_fails_saying_so(tmp_path):
    """Issue 46, point 3: the discovery script offers 1 slot and --min-np is 2: perseusrun
    waits for hosts up to --elastic-timeout (2 s here), then fails saying why, with no
    rank started."""
    cmd = perseusrun_elastic("--host-discovery-script", "echo localhost:1", "--min-np", "2",
                             "--elastic-timeout", "2") + [sys.executable, "-c", "print('ran')"]
    rc, out, err, elapsed = run_bounded(cmd, clean_env({"PERSEUS_ELASTIC_PERSIST_DIR":
                                                        str(tmp_path / "c")}), 60)
    report = "rc %d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err)
    assert rc != 0 and "ran" not in out, report
    assert ("timed out after 2 s waiting for hosts (--elastic-timeout, HOROVOD_ELASTIC_TIMEOUT): "
            "the discovery script offers 1 slot(s) (localhost:1), fewer than --min-np 2") in err, report
