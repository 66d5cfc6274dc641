"""The suite's fixtures, and the tier of each test by its folder (tests/README.md).

A rank script is what each rank of a test job runs. tests/rank_scripts/ holds those of
the torch front end (most of them) and of the core alone (through its C ABI); the
TensorFlow and MXNet ones, run by their own venvs, are in tests/tensorflow/ and
tests/mxnet/. `run_mpi(script, np, env=None, timeout=...)` runs
`mpirun -np N python tests/rank_scripts/<script>.py` and fails the calling test,
showing the job's stdout and stderr, when the job exits non-zero or outlives its
timeout (tests/support/jobs.py kills every process of the job, so a hang fails one test
and never stalls the suite).
"""
import importlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import batch_job, jobs, machine_share
from support.jobs import (DEFAULT_TIMEOUT_S, RANK_SCRIPTS, REPO_ROOT, TESTS_DIR, bounded_job,
                          clean_env, job_report, rank_job, skip_unless_possible)

# The folders of tests/ that hold test modules, each a tier with a marker of its name.
TIERS = ("unit", "mpi", "gpu", "frameworks", "launch", "meta")


# The fast tier (pytest -m fast, tests/README.md): node ids or their beginnings. Together
# they fail on a fault planted in any layer, in under 3 minutes on 2 cores.
FAST = (
    "unit/test_cpp.py",                       # the core's pure C++ parts
    "unit/test_request_packing.py",           # the request record, Python side
    "unit/test_schedule.py",
    "unit/test_single_process.py::test_world_of_one",
    "unit/test_single_process.py::test_allreduce_of_one_is_identity",
    "unit/test_single_process.py::test_allgather_broadcast_alltoall_of_one",
    "unit/test_single_process.py::test_errors_before_init_and_reinit",
    "unit/test_single_process.py::test_bad_setting_fails_init_naming_the_variable[PERSEUS_ALLREDUCE_STREAMS=0]",
    "meta/test_core_layers.py",               # C++ and Python layer rules
    "meta/test_imports.py",
    "meta/test_header_mirror.py",
    "meta/test_comment_paths.py",
    "mpi/test_multiprocess.py::test_script[allreduce-2]",   # one job: every batched core script
    "mpi/test_training_api.py::test_script[optimizer-2]",   # one job: the optimizer scripts
    "mpi/test_ddp.py::test_gradients_equal_torch_ddp[2]",
    "mpi/test_torch_backend.py::test_torch_api_ddp_fsdp_zero[2]",
    "gpu/test_torch_device.py",
    "gpu/test_gpu_core.py::test_device_lanes_on_fake_gpu",
    "frameworks/test_tensorflow.py::test_tensorflow_script[collectives-2]",  # one job: all at np 2
    "frameworks/test_mxnet.py::test_mxnet_script[collectives-2]",  # one job: the batched ones
    "launch/test_launcher.py::test_mpich",
    "launch/test_launcher.py::test_openmpi",
)


# Tests that take the machine alone when the suite runs on several workers (pytest -n N,
# tests/support/machine_share.py): node ids or their beginnings. They time a reaction (a
# peer given up, a stall, a stopped process, a failure detected, a set-up step) or use
# what is the machine's, not the test's (namespace hosts, Slurm, the shared build cache).
ALONE = (
    "mpi/test_failures.py",
    "mpi/test_fault_tolerance.py",
    "mpi/test_fault_tolerance_edges.py",
    "mpi/test_grow_in_place.py",
    "mpi/test_diagnostics.py",
    "launch/test_fault_tolerance_hosts.py",
    "launch/test_grow_across_hosts.py",
    "launch/test_multi_host.py",
    "launch/test_slurm.py",
    "launch/test_setup.py",
    "launch/test_build_mpi.py",
    "launch/test_open_mpi.py",
)
# Modules whose tests share something of the machine's made once per worker (the
# namespace hosts, a Slurm cluster): all on one worker, or two would make it at once.
ONE_WORKER = {"launch/test_fault_tolerance_hosts.py", "launch/test_grow_across_hosts.py",
              "launch/test_multi_host.py", "launch/test_slurm.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath)).relative_to(TESTS_DIR)
        tier = path.parts[0]
        if tier not in TIERS:
            raise pytest.UsageError("%s: a test module outside the tier folders %s (tests/README.md)"
                                    % (item.nodeid, ", ".join(TIERS)))
        item.add_marker(getattr(pytest.mark, tier))
        node = item.nodeid.replace("tests/", "", 1)
        if node.startswith(FAST):
            item.add_marker(pytest.mark.fast)
        if node.startswith(ALONE):
            item.add_marker(pytest.mark.alone)
        # A module's tests stay on one worker: its batch of rank scripts runs once.
        module = path.as_posix()
        item.add_marker(pytest.mark.xdist_group("machine" if module in ONE_WORKER else module))
    # On a whole collection, an entry of FAST that names no test is a typo that would
    # shrink the tier unseen.
    ids = [item.nodeid.replace("tests/", "", 1) for item in items]
    if {Path(i).parts[0] for i in ids} >= set(TIERS):
        stale = [entry for entry in FAST if not any(i.startswith(entry) for i in ids)]
        if stale:
            raise pytest.UsageError("FAST in tests/conftest.py names no test: %s" % stale)


@pytest.fixture(autouse=True)
def _machine_share(request, tmp_path_factory):
    """With several workers (-n N), each test holds the machine, shared or (ALONE) alone."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    with machine_share.hold(tmp_path_factory.getbasetemp().parent, alone):
        yield


@pytest.fixture
def run_mpi(tmp_path):
    """Returns run_mpi(script, np, env=None, timeout=DEFAULT_TIMEOUT_S, python=None,
    scripts_dir=RANK_SCRIPTS, launcher=None) -> stdout.

    Each job gets an empty scratch directory in $PTEST_TMPDIR, which ranks use to
    signal one another through files without going through the library under test.
    python: the interpreter the ranks run (default: this one); the TensorFlow tests
    pass .venv-tf's. launcher: the mpirun command and its options, before `-np N`
    (default: find_mpirun()); tests/launch/test_open_mpi.py passes Open MPI's.
    """

    def run(script, np, env=None, timeout=DEFAULT_TIMEOUT_S, python=None,
            scripts_dir=RANK_SCRIPTS, launcher=None):
        path = Path(scripts_dir) / ("%s.py" % script)
        assert path.exists(), path
        scratch = tmp_path / ("%s-np%d-%d" % (script, np, time.monotonic_ns()))
        scratch.mkdir()
        extra = dict(env or {})
        cmd, child_env = rank_job([path], np, extra, timeout, python, launcher, scratch)
        returncode, out, err, seconds, killed = bounded_job(cmd, child_env, timeout)
        if killed is not None:
            pytest.fail(job_report("%s with %d ranks did not finish within %d s (killed; the stack "
                                   "dumps in stderr show where each rank was in Python); still alive:\n%s"
                                   % (script, np, timeout, killed), cmd, extra, out, err), pytrace=False)
        if returncode != 0:
            pytest.fail(job_report("%s with %d ranks exited with code %d after %.1f s"
                                   % (script, np, returncode, seconds), cmd, extra, out, err),
                        pytrace=False)
        return out

    return run


# Scripts a batch saw through on every rank, by batch: (scripts, np, env, python).
_batches_seen = {}
# Why a batch that saw every script through failed at its exit (BatchJob.exit_failure), by batch.
_batch_exit_failures = {}
# (module, script, nprocs) and (module, nprocs, setting) of the tests this session runs.
_selected_cases = set()
_selected_settings = set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Tells tests/support/jobs.py when this test's timeout (pytest-timeout's, over set-up,
    call and teardown) fires, so that a hung job's C stacks end before it."""
    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0] if marker and marker.args else item.config.getini("timeout") or 0)
    jobs.test_deadline = time.monotonic() + limit if limit > 0 else None
    yield
    jobs.test_deadline = None


def pytest_collection_finish(session):
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "script" in params and "nprocs" in params:
            _selected_cases.add((str(item.fspath), params["script"], params["nprocs"]))
        if "setting" in params:
            _selected_settings.add((str(item.fspath), params.get("nprocs"), params["setting"]))


@pytest.fixture
def run_mpi_batch(run_mpi, tmp_path_factory, request):
    """Returns run_mpi_batch(script, np, batch, env=None, timeout=DEFAULT_TIMEOUT_S,
    python=None, scripts_dir=RANK_SCRIPTS, settings=None, setting=None): the test of
    `script`, one of the scripts in `batch`, which the first of their tests runs in one
    job (tests/support/rank_batch.py), each in turn, within `timeout`. A script the batch
    saw through passes, unless the job then failed at its exit (a non-zero code, a rank
    that died, a hang: BatchJob.exit_failure), which fails every test of the batch; any
    other (it failed, or one before it did, or the batch ran out of time) runs alone
    through run_mpi, whose report is the test's. For scripts that need no fresh process:
    a script that fails only after another in the same process is not reported as such
    (it passes alone). Where this session runs only some of the batch's tests (-m fast,
    -k), the batch holds only their scripts.

    settings ({name: env}): each script of the batch runs once under each, its variables
    set on top of `env` for that run only; the test is that of `setting`, and the tests
    are parametrised by "setting" (and "nprocs" where the names repeat across np). Only
    for variables read at each init() (the engine's, csrc/src/engine/config.cc), never
    for what is read once a process; the script checks that it runs under them
    (rank_scripts/common.py's check_engine_settings)."""
    module = str(request.node.fspath)

    def run(script, np, batch, env=None, timeout=DEFAULT_TIMEOUT_S, python=None,
            scripts_dir=RANK_SCRIPTS, settings=None, setting=None):
        assert script in batch, (script, batch)
        assert (settings is None) == (setting is None) and (setting is None or setting in settings)
        batch = [s for s in batch if (module, s, np) in _selected_cases] or batch
        if settings is not None:
            chosen = [k for k in settings if (module, np, k) in _selected_settings
                      or (module, None, k) in _selected_settings] or list(settings)
            entries = {"%s[%s]" % (s, k): (s, dict(settings[k])) for s in batch for k in chosen}
            mine = "%s[%s]" % (script, setting)
        else:
            entries = {s: (s, {}) for s in batch}
            mine = script
        if len(entries) == 1:
            run_mpi(script, np, env=dict(env or {}, **entries[mine][1]), timeout=timeout,
                    python=python, scripts_dir=scripts_dir)
            return
        key = (tuple(entries), tuple(tuple(sorted(e.items())) for _, e in entries.values()), np,
               tuple(sorted((env or {}).items())), str(python), str(scripts_dir))
        if key not in _batches_seen:
            _batches_seen[key] = set()  # an interrupted batch is not run again
            job = batch_job.run(entries, np, env or {}, timeout,
                                tmp_path_factory.mktemp("batch-np%d" % np), python, scripts_dir)
            _batches_seen[key] = {n for n in entries if job.ended(n)}
            _batch_exit_failures[key] = job.exit_failure()
        if mine not in _batches_seen[key]:
            run_mpi(script, np, env=dict(env or {}, **entries[mine][1]), timeout=timeout,
                    python=python, scripts_dir=scripts_dir)
        elif _batch_exit_failures.get(key):
            pytest.fail("%s ended, but %s" % (mine, _batch_exit_failures[key]), pytrace=False)

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


@pytest.fixture(scope="session")
def cpp_test(tmp_path_factory):
    """Returns cpp_test(name) -> the binary of tests/cpp/<name>.cc, linked against the
    core's objects (tests/support/cpp_build.py), each built once per session."""
    from support import cpp_build
    folder = tmp_path_factory.mktemp("cpp")
    built = {}

    def build(name):
        if "archive" not in built:
            built["archive"] = cpp_build.core_archive(folder)
        if name not in built:
            built[name] = cpp_build.build_cpp_test(folder, name, built["archive"])
        return built[name]

    return build


@pytest.fixture(scope="session")
def fake_gpu(tmp_path_factory):
    """The fake CUDA runtime and NCCL (tests/gpu_fakes): one library, linked as
    libcudart.so.12 and libnccl.so.2 in one folder; the environment that points the core
    at it (PERSEUS_CUDA_LIB, PERSEUS_NCCL_LIB) and the fake at its device folder."""
    from support import fake_gpu as fake
    from support.cpp_build import find_mpi_compiler
    folder = tmp_path_factory.mktemp("fake_gpu")
    library = fake.build(find_mpi_compiler("mpicc"), folder)
    return {"PERSEUS_CUDA_LIB": str(folder), "PERSEUS_NCCL_LIB": str(folder),
            "FAKE_GPU_LIB": library, "FAKE_GPU_DEVICE_DIR": str(folder)}


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


@pytest.fixture(scope="module")
def settings_at_init():
    """Returns settings_at_init(envs, keys) -> for each env of `envs`, in order, the output
    of an init() under it that prints "SETTINGS" and config()'s value of each key, or
    "VALUE_ERROR: <message>" if init() refuses the environment. All of them run in one
    fresh process (support/init_batch.py: the core reads its settings at each init())."""
    from support import init_batch

    def run(envs, keys):
        code = _SETTINGS_AT_INIT % (tuple(keys),)
        results = init_batch.run({"case%d" % i: (env, code) for i, env in enumerate(envs)})
        return [results["case%d" % i].stdout + results["case%d" % i].stderr for i in range(len(envs))]

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


@pytest.fixture(scope="session")
def hosts(tmp_path_factory):
    """hostA, hostB and hostC (a host to replace one), made of Linux namespaces for the
    session (tests/support/fake_hosts.py):
    multi-host runs on one machine. Not root: skipped (except under CI). Root without
    `ip`, `unshare` or `nsenter`: failed, since scripts/setup.sh --all installs them."""
    from support import fake_hosts
    if os.geteuid() != 0:
        skip_unless_possible("namespace hosts need root (network namespaces, veths, mounts)")
    missing = fake_hosts.missing_tools()
    if missing:
        pytest.fail(missing, pytrace=False)
    with fake_hosts.FakeHosts(["hostA", "hostB", "hostC"],
                                  tmp_path_factory.mktemp("hosts")) as made:
        yield made
