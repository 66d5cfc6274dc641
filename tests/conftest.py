"""Shared fixtures: launching rank scripts under mpirun.

A rank script is what each rank of a test job runs. tests/rank_scripts/ holds those of
the torch front end (most of them) and of the core alone (through its C ABI); the
TensorFlow and MXNet ones, run by their own venvs, are in tests/tensorflow/ and
tests/mxnet/. `run_mpi(script, np, env=None, timeout=...)` runs
`mpirun -np N python tests/rank_scripts/<script>.py` and fails the calling test,
showing the job's stdout and stderr, when the job exits non-zero or outlives its
timeout. On timeout every process of the job is killed, so a
hang fails one test and never stalls the suite.
"""
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perseus.launcher import LAUNCHER_STATE_PREFIXES

TESTS_DIR = Path(__file__).resolve().parent
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


def kill_job(proc):
    """SIGKILL the launcher and every process it started. Returns what was still alive."""
    alive = describe_processes([proc.pid] + _descendants(proc.pid))
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
    returncode, out, err, seconds, killed = _bounded_job(cmd, env, timeout)
    if killed is not None:
        pytest.fail("%s did not finish within %d s; still alive:\n%s\n----- stdout -----\n%s\n"
                    "----- stderr -----\n%s" % (" ".join(cmd), timeout, killed, out, err[-6000:]),
                    pytrace=False)
    return returncode, out, err, seconds


def _report(what, cmd, env_extra, out, err):
    return "%s\ncommand: %s\nextra env: %s\n----- stdout -----\n%s\n----- stderr -----\n%s" % (
        what, " ".join(cmd), env_extra or {}, out, err)


def _bounded_job(cmd, child_env, timeout):
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
        killed = kill_job(proc)
    finally:
        if proc.poll() is None:
            kill_job(proc)
    if killed is not None:
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a straggler still holds the pipes
            out, err = "(unreadable)", "(unreadable)"
    return proc.returncode, out, err, time.monotonic() - start, killed


def _rank_job(scripts, np, env, timeout, python, launcher, scratch):
    """The command and environment of a job running `scripts` (one: itself; several:
    tests/rank_batch.py runs them in turn) on np ranks."""
    # Ranks dump every thread's stack shortly before the kill (tests/rank_script.py).
    child_env = clean_env(dict(env, PTEST_TMPDIR=str(scratch),
                               PTEST_HANG_DUMP_S=str(max(1, timeout - 15))))
    runner = [str(TESTS_DIR / "rank_batch.py")] if len(scripts) > 1 else []
    cmd = list(launcher or [find_mpirun()]) + ["-np", str(np), str(python or sys.executable)] + \
        runner + [str(s) for s in scripts]
    return cmd, child_env


@pytest.fixture
def run_mpi(tmp_path):
    """Returns run_mpi(script, np, env=None, timeout=DEFAULT_TIMEOUT_S, python=None,
    scripts_dir=RANK_SCRIPTS, launcher=None) -> stdout.

    Each job gets an empty scratch directory in $PTEST_TMPDIR, which ranks use to
    signal one another through files without going through the library under test.
    python: the interpreter the ranks run (default: this one); the TensorFlow tests
    pass .venv-tf's. launcher: the mpirun command and its options, before `-np N`
    (default: find_mpirun()); tests/test_open_mpi.py passes Open MPI's.
    """

    def run(script, np, env=None, timeout=DEFAULT_TIMEOUT_S, python=None,
            scripts_dir=RANK_SCRIPTS, launcher=None):
        path = Path(scripts_dir) / ("%s.py" % script)
        assert path.exists(), path
        scratch = tmp_path / ("%s-np%d-%d" % (script, np, time.monotonic_ns()))
        scratch.mkdir()
        extra = dict(env or {})
        cmd, child_env = _rank_job([path], np, extra, timeout, python, launcher, scratch)
        returncode, out, err, seconds, killed = _bounded_job(cmd, child_env, timeout)
        if killed is not None:
            pytest.fail(_report("%s with %d ranks did not finish within %d s (killed; the stack dumps "
                                "in stderr show where each rank was)" % (script, np, timeout),
                                cmd, extra, out, err), pytrace=False)
        if returncode != 0:
            pytest.fail(_report("%s with %d ranks exited with code %d after %.1f s"
                                % (script, np, returncode, seconds), cmd, extra, out, err),
                        pytrace=False)
        return out

    return run


# Scripts a batch saw through on every rank, by batch: (scripts, np, env, python).
_batches_seen = {}


@pytest.fixture
def run_mpi_batch(run_mpi, tmp_path_factory):
    """Returns run_mpi_batch(script, np, batch, env=None, timeout=DEFAULT_TIMEOUT_S,
    python=None, scripts_dir=RANK_SCRIPTS): the test of `script`, one of the scripts
    in `batch`, which the first of their tests runs in one job (tests/rank_batch.py),
    each in turn, within `timeout`. A script the batch saw through passes; any other
    (it failed, or one before it did, or the batch ran out of time) runs alone through
    run_mpi, whose report is the test's. For scripts that need no fresh process: a
    script that fails only after another in the same process is not reported as such
    (it passes alone)."""

    def run(script, np, batch, env=None, timeout=DEFAULT_TIMEOUT_S, python=None,
            scripts_dir=RANK_SCRIPTS):
        assert script in batch, (script, batch)
        key = (tuple(batch), np, tuple(sorted((env or {}).items())), str(python), str(scripts_dir))
        if key not in _batches_seen:
            _batches_seen[key] = set()  # an interrupted batch is not run again
            scratch = tmp_path_factory.mktemp("batch-np%d" % np)
            paths = [Path(scripts_dir) / ("%s.py" % s) for s in batch]
            cmd, child_env = _rank_job(paths, np, dict(env or {}), timeout, python, None, scratch)
            _, out, _, _, _ = _bounded_job(cmd, child_env, timeout)
            ended = re.findall(r"BATCH END (\S+)", out)
            _batches_seen[key] = {s for s in batch if ended.count(s) == np}
        if script not in _batches_seen[key]:
            run_mpi(script, np, env=env, timeout=timeout, python=python, scripts_dir=scripts_dir)

    return run


@pytest.fixture
def run_python():
    """Returns run_python(code, env=None, timeout=60) -> CompletedProcess: `python -c code`
    in a fresh process without mpirun, with a clean environment plus `env`."""

    def run(code, env=None, timeout=60):
        try:
            return subprocess.run([sys.executable, "-c", code], cwd=str(REPO_ROOT), env=clean_env(env),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as e:
            pytest.fail("python -c did not finish within %d s\nenv: %s\ncode:\n%s\nstdout:\n%s\nstderr:\n%s"
                        % (timeout, env, code, e.stdout, e.stderr), pytrace=False)

    return run


@pytest.fixture(scope="session")
def shim(tmp_path_factory):
    """Returns shim(name) -> the path of tests/shims/<name>.c built as a shared library
    (once per session), to LD_PRELOAD in a child process: a stand-in for an MPI
    function that makes a rare or machine-specific behaviour happen on every run."""
    built = {}

    def build(name):
        if name not in built:
            compiler = shutil.which("cc") or shutil.which("gcc")
            if compiler is None:
                pytest.fail("no C compiler (cc, gcc) on PATH to build tests/shims/%s.c" % name)
            out = tmp_path_factory.mktemp("shim") / ("%s.so" % name)
            subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out),
                            str(TESTS_DIR / "shims" / ("%s.c" % name)), "-ldl"], check=True)
            built[name] = str(out)
        return built[name]

    return build


_SETTINGS_AT_INIT = """
import perseus.torch.horovod as hvd
try:
    hvd.init()
except ValueError as e:
    print("VALUE_ERROR:", e)
else:
    c = hvd.config()
    print("SETTINGS", *(c[key] for key in %r))
    hvd.shutdown()
"""


@pytest.fixture
def settings_at_init(run_python):
    """Returns settings_at_init(env, keys) -> the stdout of one process that runs init()
    under `env` and prints "SETTINGS" and config()'s value of each key, or
    "VALUE_ERROR: <message>" if init() refuses the environment."""

    def run(env, keys):
        result = run_python(_SETTINGS_AT_INIT % (tuple(keys),), env=env)
        return result.stdout + result.stderr

    return run


@pytest.fixture(scope="module")
def hvd():
    """perseus.torch.horovod, initialised for one test module, shut down after it
    (imported here, so collection works even when the package is broken)."""
    module = importlib.import_module("perseus.torch.horovod")
    module.init()
    yield module
    module.shutdown()


@pytest.fixture
def initialized(hvd):
    """hvd, re-initialised if a previous test left it shut down."""
    if not hvd.is_initialized():
        hvd.init()
    return hvd


def skip_unless_possible(reason):
    """Skips a test that cannot run here, saying why; under CI (CI=true) fails it
    instead, so that a machine that lost a capability cannot pass CI by skipping."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail("CI must run this test, but: " + reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def hosts(tmp_path_factory):
    """hostA and hostB, made of Linux namespaces for the session (tests/fake_hosts.py):
    multi-host runs on one machine. Not root: skipped (except under CI). Root without
    `ip`, `unshare` or `nsenter`: failed, since scripts/setup.sh --all installs them."""
    import fake_hosts
    if os.geteuid() != 0:
        skip_unless_possible("namespace hosts need root (network namespaces, veths, mounts)")
    missing = fake_hosts.missing_tools()
    if missing:
        pytest.fail(missing, pytrace=False)
    with fake_hosts.FakeHosts(["hostA", "hostB"], tmp_path_factory.mktemp("hosts")) as made:
        yield made
