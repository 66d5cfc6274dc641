"""What every per-rank test script shares, whichever framework and venv runs it
(tests/rank_scripts, tests/tensorflow, tests/mxnet): no framework import here.

- A stack dump of every thread shortly before the driver's timeout
  (PTEST_HANG_DUMP_S), so a hang shows its place.
- `log()` lines tagged with the rank.
- `CapturedStderr`: what the core logs to fd 2 inside a block.
- `main(body)`: any exception prints a traceback tagged with the rank and ends the
  process with exit code 1 at once, without atexit hooks (MPICH then tears the job
  down); success prints "ok".
"""
import faulthandler
import os
import sys
import tempfile
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
    print(rank_tag(), *args, flush=True)


def main(body):
    """Run body(); on any exception print it and exit 1 without running atexit hooks."""
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
    sys.exit(0)


class CapturedStderr:
    """Everything written to fd 2 (by the C++ core too) while inside the block."""

    def __enter__(self):
        self.file = tempfile.TemporaryFile(mode="w+b")
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        self.text = self.file.read().decode(errors="replace")
        os.write(2, self.file.read())
        return False
