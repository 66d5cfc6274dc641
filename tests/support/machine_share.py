"""Sharing the machine between the suite's workers (pytest-xdist: `pytest -n N`).

Many tests wait more than they compute (process starts, a peer's reply), so on a
machine with cores to spare several can run at once. Some must have the machine to
themselves: those that time a reaction (a peer given up after a timeout, a stall, a
stopped process, a failure detected) or that use something of the machine's that is
not per test (namespace hosts, a Slurm cluster, the shared build cache). Such a test
(ALONE in tests/conftest.py) takes the machine alone; every other test shares it.

A lock between processes with writer preference, from two flock()ed files in a folder
the run's workers share: `gate`, held briefly by whoever is about to take `machine`,
and by an alone test until it has `machine` to itself, so that a waiting alone test is
not passed by the other workers' next tests; `machine`, shared by ordinary tests and
exclusive for an alone one.
"""
import contextlib
import fcntl
import os
from pathlib import Path


@contextlib.contextmanager
def _flocked(path, mode):
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def hold(folder, alone):
    """Holds the machine for one test: alone (exclusive) or shared with the other
    worker's tests; `folder` is one every worker of this run shares."""
    folder = Path(folder)
    with contextlib.ExitStack() as held:
        with _flocked(folder / "machine-gate.lock", fcntl.LOCK_EX):
            held.enter_context(_flocked(folder / "machine.lock",
                                        fcntl.LOCK_EX if alone else fcntl.LOCK_SH))
        yield
