"""What every per-rank test script shares, whichever framework and venv runs it
(tests/rank_scripts, tests/tensorflow, tests/mxnet): no framework import here.

- A stack dump of every thread shortly before the driver's timeout
  (PTEST_HANG_DUMP_S), so a hang shows its place.
- `log()` lines tagged with the rank.
- `CapturedStderr`: what the core logs to fd 2 inside a block.
- A rank that stops itself (SIGSTOP) for the others to find: `victim_file()`,
  `announce_victim()`, `wait_for_stop()`.
- `main(body)`: any exception prints a traceback tagged with the rank and ends the
  process with exit code 1 at once, without atexit hooks (MPICH then tears the job
  down); success prints "ok" and leaves through the exit hooks (Python's, then the C
  ones: the core's shutdown and MPI_Finalize) without the interpreter's teardown of its
  modules, which took 0.5 s of CPU a process once torch was imported (issue 50, point
  3); `main(body, teardown=True)` for a script whose subject is the ordinary exit.
"""
import faulthandler
import os
import sys
import tempfile
import time
import traceback

if os.environ.get("PTEST_HANG_DUMP_S"):
    faulthandler.dump_traceback_later(float(os.environ["PTEST_HANG_DUMP_S"]), exit=False)

LAUNCHER_VARS = [("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMIX_RANK", "PMIX_SIZE")]


def launcher_rank_size():
    """(rank, size) as the launcher (MPICH's hydra, Open MPI) told this process."""
    for rank_var, size_var in LAUNCHER_VARS:
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    raise AssertionError("no launcher variables (%s) in the environment" % LAUNCHER_VARS)


def rank_tag():
    for rank_var, _ in LAUNCHER_VARS:
        if rank_var in os.environ:
            return "[rank %s]" % os.environ[rank_var]
    return "[rank ?]"


def log(*args):
    """One line on stdout, as print would write it, in one write: under PYTHONUNBUFFERED
    (tests/support/jobs.py sets it) print writes each piece apart, and mpirun, merging
    the ranks' output, put another rank's line inside this one's (a test counting lines
    failed 1 run in 13)."""
    sys.stdout.write(" ".join(str(a) for a in (rank_tag(),) + args) + "\n")
    sys.stdout.flush()


# Set by tests/support/rank_batch.py, which runs scripts one after another in one
# process: main() then raises SystemExit(0) for the batch to go on, which leaves at its end.
IN_BATCH = False


def main(body, teardown=False):
    """Run body(); on any exception print it and exit 1 without running atexit hooks.
    On success: exit 0, with the interpreter's teardown only if `teardown`."""
    try:
        body()
    except BaseException:
        sys.stdout.flush()
        sys.stderr.write("%s FAILED\n" % rank_tag())
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    log("ok")
    sys.stdout.flush()
    if teardown or IN_BATCH:
        sys.exit(0)
    leave_without_teardown(0)


def leave_without_teardown(code):
    """What sys.exit(code) does at the end of a script, but the interpreter's teardown
    of its modules: the non-daemon threads joined, Python's atexit hooks (Perseus's
    shutdown among them), then C's exit(), whose hooks (the core's FinalizeAtExit:
    MPI_Finalize) and C++ destructors run as after that teardown. The teardown cost
    0.45-0.5 s of CPU a process once torch was imported (1.7 s -> 1.2 s for `import
    torch` alone), a second for each job of 4 ranks on 2 cores."""
    if "mpi4py" in sys.modules:
        sys.exit(code)  # mpi4py's MPI_Finalize is a hook of that teardown (Py_AtExit)
    import atexit
    import ctypes
    import threading
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    # With the GIL held, as at the end of an ordinary exit: C++ destructors of extension
    # modules (torch's) take Python objects down (ctypes.CDLL, which drops the GIL for the
    # call, made them abort: "PyThreadState_Get: ... the GIL is released"). Perseus's
    # shutdown ran above, so no thread of the core calls back into Python any more.
    ctypes.PyDLL(None).exit(code)


class CapturedStderr:
    """Everything written to fd 2 (by the C++ core too) while inside the block."""

    def __enter__(self):
        self.file = tempfile.TemporaryFile(mode="w+b")
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def so_far(self):
        """What was written to fd 2 since the block began (inside the block)."""
        return os.pread(self.file.fileno(), 1 << 24, 0).decode(errors="replace")

    def wait_for_text(self, text, within_s):
        """Waits, inside the block, until `text` is written to fd 2; AssertionError,
        with what was written, if it is not there within `within_s` seconds."""
        deadline = time.monotonic() + within_s
        while text not in self.so_far():
            assert time.monotonic() < deadline, "%r not written within %g s:\n%s" % (
                text, within_s, self.so_far())
            time.sleep(0.01)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        self.text = self.file.read().decode(errors="replace")
        os.write(2, self.file.read())
        return False


def victim_file():
    """Where a rank that stops itself writes its pid and the time: $PTEST_TMPDIR/stopped."""
    return os.path.join(os.environ["PTEST_TMPDIR"], "stopped")


def announce_victim():
    """Writes this process's pid and the time to victim_file(), atomically."""
    path = victim_file()
    with open(path + ".tmp", "w") as f:
        f.write("%d %f" % (os.getpid(), time.time()))
    os.replace(path + ".tmp", path)


def wait_for_stop(within_s=30):
    """Waits until the victim has announced itself and /proc shows it stopped; its pid."""
    path, deadline = victim_file(), time.monotonic() + within_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "the victim's pid never came"
        time.sleep(0.01)
    with open(path) as f:
        pid = int(f.read().split()[0])
    while True:
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return pid
        assert time.monotonic() < deadline, "the victim never stopped"
        time.sleep(0.01)
