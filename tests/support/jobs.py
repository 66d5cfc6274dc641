"""Running jobs for the tests: the repo's folders, the mpirun to use, a clean child
environment, and a bounded run that kills every process a job started when it outlives
its timeout (so a hang fails one test and never stalls the suite). The fixtures over
these (run_mpi, run_mpi_batch, run_python, ...) are in tests/conftest.py.
"""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perseus.common.launch_check import LAUNCHER_STATE_PREFIXES


TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent
RANK_SCRIPTS = TESTS_DIR / "rank_scripts"  # torch and core-only rank scripts
# Build helpers the tests share with setup.py and the benchmarks (other_mpi_core.py).
BUILD_SUPPORT = REPO_ROOT / "build_support"
if str(BUILD_SUPPORT) not in sys.path:
    sys.path.insert(0, str(BUILD_SUPPORT))

DEFAULT_TIMEOUT_S = 150

# Variables that would leak a launcher's or a developer's setup into the job. The tests
# set the PERSEUS_* / HOROVOD_* knobs they exercise explicitly; logging may pass through,
# and so may Open MPI's permission to run as root and to oversubscribe (never a
# launcher's state).
_DROPPED_PREFIXES = LAUNCHER_STATE_PREFIXES + ("PERSEUS_", "HOROVOD_")
_KEPT = {"PERSEUS_LOG_LEVEL", "HOROVOD_LOG_LEVEL", "OMPI_ALLOW_RUN_AS_ROOT",
         "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "OMPI_MCA_rmaps_base_oversubscribe"}
# Names of further variables to pass on, space-separated: the settings an MPI was chosen
# with (scripts/gpu_check.sh lists there the ones it sets, e.g. OMPI_MCA_plm_rsh_agent).
KEEP_ENV = "PERSEUS_KEEP_ENV"


def find_mpirun():
    """The mpirun perseusrun would use: $PERSEUS_MPIRUN, else the one next to this
    interpreter (the venv's mpich wheel), else the first on PATH."""
    from perseus import launcher
    try:
        return launcher.find_mpirun()
    except launcher.LauncherError as e:
        pytest.fail(str(e), pytrace=False)


def framework_python(label, tag, setup_script):
    """The python of a framework's own venv (.venv-<tag>, or $PERSEUS_<TAG>_PYTHON).
    PERSEUS_SKIP_<TAG>=1 skips the framework's tests on purpose; a missing venv
    otherwise fails them, so a broken setup never passes CI as skips."""
    skip_var = "PERSEUS_SKIP_%s" % tag.upper()
    if os.environ.get(skip_var) == "1":
        pytest.skip("%s=1: %s front-end tests skipped on purpose" % (skip_var, label))
    python = Path(os.environ.get("PERSEUS_%s_PYTHON" % tag.upper())
                  or REPO_ROOT / (".venv-%s" % tag) / "bin" / "python")
    if not python.exists():
        pytest.fail("%s not found: run `bash scripts/%s` (scripts/setup.sh does) to create the "
                    "%s venv, or set %s=1 to skip these tests"
                    % (python, setup_script, label, skip_var), pytrace=False)
    return python


# TensorFlow's start-up banners on every rank.
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def tf_python():
    return framework_python("TensorFlow", "tf", "setup_tf.sh")


def clean_env(extra=None):
    """A copy of os.environ fit for a child job: no launcher state, one thread per rank."""
    kept = _KEPT | set(os.environ.get(KEEP_ENV, "").split())
    env = {
        k: v
        for k, v in os.environ.items()
        if k in kept or not k.startswith(_DROPPED_PREFIXES)
    }
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def _descendants(pid):
    """All processes below pid, found through /proc (the MPICH launcher puts each
    proxy and rank in a session of its own, so a process-group kill misses them)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        # Field 4 (ppid) follows the parenthesised command name, which may hold spaces.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _is_python(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return b"python" in f.read()
    except OSError:
        return False


def describe_processes(pids):
    """One line per process and thread: state and kernel wait channel, to show where a hang sat."""
    lines = []
    for pid in pids:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            tids = sorted(os.listdir("/proc/%d/task" % pid), key=int)
        except OSError:
            continue
        lines.append("pid %d: %s" % (pid, cmd))
        for tid in tids:
            try:
                with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                    stat = f.read()
                with open("/proc/%d/task/%s/wchan" % (pid, tid)) as f:
                    wchan = f.read().strip()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            state = stat.rsplit(")", 1)[1].split()[0]
            lines.append("    tid %s %-16s state %s wchan %s" % (tid, name, state, wchan or "-"))
    return "\n".join(lines)


# The C stacks of a hung job take at most this long in all (gdb: about 6 s a process
# with torch loaded), and end this long before the running test's own timeout
# (pytest-timeout's thread method would end the whole session): test_deadline, set by
# tests/conftest.py for each test.
C_STACKS_S = 30
C_STACKS_MARGIN_S = 20
C_STACK_LINES = 80  # a process's at most
test_deadline = None  # time.monotonic() when the running test's timeout fires, if it has one


def c_stacks(pids, within_s=C_STACKS_S):
    """Every thread's C stack of each process, by gdb (in the machine image), within
    `within_s` in all: where a hang sits below Python, as in MPI_Finalize after the
    interpreter's teardown, where the ranks' faulthandler dumps no longer come."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(no C stacks: gdb is not installed)"
    deadline = time.monotonic() + within_s
    if test_deadline is not None:
        deadline = min(deadline, test_deadline - C_STACKS_MARGIN_S)
    parts = []
    for pid in pids:
        left = deadline - time.monotonic()
        if left < 1:
            parts.append("pid %d: no time left for its C stack" % pid)
            continue
        try:
            done = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "set print frame-arguments none",
                                   "-ex", "thread apply all bt 12"], stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            parts.append("pid %d: gdb gave no C stack within %.0f s" % (pid, left))
            continue
        frames = [line for line in done.stdout.splitlines() if line.startswith(("Thread ", "#"))]
        if frames:
            parts.append("pid %d C stacks:\n%s" % (pid, "\n".join(frames[:C_STACK_LINES])))
        else:  # gone meanwhile, or attaching not permitted (ptrace)
            parts.append("pid %d: no C stack (gdb: %s)" % (pid, " ".join(done.stderr.split())[-300:]))
    return "\n".join(parts)


def kill_job(proc, stacks=False):
    """SIGKILL the launcher and every process it started. Returns what was still alive
    (with `stacks`, their C stacks too: for a hang)."""
    pids = [proc.pid] + _descendants(proc.pid)
    alive = describe_processes(pids)
    if stacks:
        alive += "\n" + c_stacks(sorted(pids, key=lambda pid: not _is_python(pid)))  # the ranks first
    for _ in range(3):
        victims = _descendants(proc.pid)
        for pid in victims + [proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not victims:
            break
        time.sleep(0.1)
    return alive


def run_bounded(cmd, env, timeout):
    """Runs `cmd` from the repo root in a session of its own -> (returncode, stdout,
    stderr, seconds). Past `timeout` every process it started is killed and the test
    fails, naming what was still alive: a hang never outlives its test."""
    cmd = [str(a) for a in cmd]
    returncode, out, err, seconds, killed = bounded_job(cmd, env, timeout)
    if killed is not None:
        pytest.fail("%s did not finish within %d s; still alive:\n%s\n----- stdout -----\n%s\n"
                    "----- stderr -----\n%s" % (" ".join(cmd), timeout, killed, out, err[-6000:]),
                    pytrace=False)
    return returncode, out, err, seconds


def job_report(what, cmd, env_extra, out, err):
    return "%s\ncommand: %s\nextra env: %s\n----- stdout -----\n%s\n----- stderr -----\n%s" % (
        what, " ".join(cmd), env_extra or {}, out, err)


def bounded_job(cmd, child_env, timeout):
    """Runs a job from the repo root in a session of its own -> (returncode, stdout,
    stderr, seconds, killed); past `timeout` every process it started is killed, and
    `killed` says what was still alive then (None if it finished in time)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=child_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    killed = None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        killed = kill_job(proc, stacks=True)
    finally:
        if proc.poll() is None:
            kill_job(proc)
    if killed is not None:
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a straggler still holds the pipes
            out, err = "(unreadable)", "(unreadable)"
    return proc.returncode, out, err, time.monotonic() - start, killed


def rank_job(scripts, np, env, timeout, python, launcher, scratch):
    """The command and environment of a job running `scripts` (one: itself; several:
    tests/support/rank_batch.py runs them in turn) on np ranks."""
    # Ranks dump every thread's stack shortly before the kill (tests/support/rank_script.py).
    child_env = clean_env(dict(env, PTEST_TMPDIR=str(scratch),
                               PTEST_HANG_DUMP_S=str(max(1, timeout - 15))))
    runner = [str(TESTS_DIR / "support" / "rank_batch.py")] if len(scripts) > 1 else []
    cmd = list(launcher or [find_mpirun()]) + ["-np", str(np), str(python or sys.executable)] + \
        runner + [str(s) for s in scripts]
    return cmd, child_env


def skip_unless_possible(reason):
    """Skips a test that cannot run here, saying why; under CI (CI=true) fails it
    instead, so that a machine that lost a capability cannot pass CI by skipping."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail("CI must run this test, but: " + reason, pytrace=False)
    pytest.skip(reason)




def run_job(np, argv, env=None, timeout=60):
    """`mpirun -np N <argv>` from the repo root -> stdout; fails the test, showing the
    job's output, when it exits non-zero."""
    cmd = [find_mpirun(), "-np", str(np)] + list(argv)
    code, out, err, seconds = run_bounded(cmd, clean_env(env), timeout)
    if code != 0:
        pytest.fail("%s exited with %d after %.1f s\nstdout:\n%s\nstderr:\n%s"
                    % (" ".join(map(str, cmd)), code, seconds, out, err), pytrace=False)
    return out
