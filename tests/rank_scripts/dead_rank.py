"""A rank that leaves in the middle of training (driven by tests/mpi/test_failures.py, not
by run_mpi: the job is expected to fail). The last rank leaves at step LEAVE_STEP:

PTEST_LEAVE=kill      SIGKILL to itself (a crash): MPICH's launcher tears the job down
PTEST_LEAVE=exit      sys.exit(0) without shutdown(): the atexit hook shuts Perseus down
PTEST_LEAVE=shutdown  shutdown() while the others still submit, then lingers and leaves
PTEST_LEAVE=os_exit   os._exit(3): no exit hook runs
PTEST_LEAVE=segv      SIGSEGV to itself (a crash in native code)
PTEST_LEAVE=raise     an uncaught exception

PTEST_WORKLOAD=allreduce (a loop of named allreduces) or optimizer (DistributedOptimizer
training). Survivors print "SURVIVOR <rank> <exception>: <message>" and exit 3 when an
error reaches them; one that trains on for 60 s without an error prints "NO ERROR".
The victim writes the time it left to $PTEST_TMPDIR/left.
"""
import os
import signal
import sys
import time

import torch

from common import PlainSGD, hvd, init, touch

LEAVE_STEP = 20


def leave(how):
    touch("left")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit":
        sys.exit(0)
    elif how == "shutdown":
        hvd.shutdown()
        time.sleep(5)  # still alive while the others find out
        # Not sys.exit: once in CI (1 of about 30 runs, not reproduced here) this rank's
        # MPI_Finalize waited in MPICH's PMI read after the survivor had left, and
        # hydra never ended it. The survivors' error is what this case checks.
        os._exit(0)
    elif how == "os_exit":
        os._exit(3)
    elif how == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif how == "raise":
        raise Victim("left at step %d" % LEAVE_STEP)
    raise AssertionError("unknown PTEST_LEAVE %r" % how)


class Victim(Exception):
    """Raised by the leaving rank only: not caught as a survivor's error."""


def steps(workload):
    """Yields once per training step, running the step's collectives before each yield."""
    if workload == "allreduce":
        while True:
            for k in range(4):
                hvd.allreduce(torch.ones(1000), name="grad.%d" % k)
            yield
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    # SGD without torch._dynamo's import (common.PlainSGD): 2-4 ranks on 2 cores.
    opt = hvd.DistributedOptimizer(PlainSGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    while True:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        yield


def body():
    rank, size = init()
    how, workload = os.environ["PTEST_LEAVE"], os.environ["PTEST_WORKLOAD"]
    deadline = time.monotonic() + 60
    try:
        for step, _ in enumerate(steps(workload)):
            if rank == size - 1 and step == LEAVE_STEP:
                leave(how)
            if time.monotonic() > deadline:
                break
    except Victim:
        raise
    except Exception as e:  # noqa: BLE001 - reporting whatever reached the survivor
        # One write per line: mpirun merges the ranks' output.
        os.write(1, ("SURVIVOR %d %s: %s\n" % (rank, type(e).__name__, e)).encode())
        os._exit(3)
    print("NO ERROR on rank %d" % rank, flush=True)


if __name__ == "__main__":
    body()
