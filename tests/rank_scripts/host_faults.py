"""A job on two namespace hosts that loses hostB while its allreduces are in flight
(tests/launch/test_multi_host.py runs it with perseusrun, not run_mpi: the job must fail).

Every rank loops over allreduces of 1 MiB and smaller tensors, several in flight at
once. Once all have done STEPS_BEFORE_FAULT steps, rank 0 writes $PTEST_TMPDIR/running
and the ranks carry on; the test then takes hostB's link down, or kills or stops its
ranks, and writes the time it did to $PTEST_TMPDIR/fault. A rank that gets an error
writes the time to $PTEST_TMPDIR/error.<rank> with the error, prints it as
"ERROR <rank> <type>: <message>" and lets it end the script as any training script
would (the exception propagates; exit code 1). A rank still without an error after
PTEST_FAULT_WAIT_S seconds prints "NO ERROR" and exits 0.
"""
import os
import socket
import time

import torch

from common import hvd, init, touch

STEPS_BEFORE_FAULT = 5
SIZES = (1 << 18, 1000, 1 << 16)  # float32 elements: 1 MiB, 4 KB, 256 KiB


def step(rank, k):
    handles = [hvd.allreduce_async(torch.full((n,), float(rank + k)), name="fault.%d" % i, op=hvd.Sum)
               for i, n in enumerate(SIZES)]
    for handle in handles:
        hvd.synchronize(handle)


def report(rank, error):
    line = "ERROR %d %s: %s" % (rank, type(error).__name__, error)
    path = os.path.join(os.environ["PTEST_TMPDIR"], "error.%d" % rank)
    with open(path + ".tmp", "w") as f:
        f.write("%r\n%s %s\n" % (time.time(), socket.gethostname(), line))
    os.replace(path + ".tmp", path)
    os.write(1, (line + "\n").encode())  # one write: the ranks' output is merged


def body():
    rank, size = init()
    deadline = time.monotonic() + float(os.environ["PTEST_FAULT_WAIT_S"])
    k = 0
    try:
        while time.monotonic() < deadline:
            step(rank, k)
            k += 1
            if k == STEPS_BEFORE_FAULT and rank == 0:
                touch("running")
    except Exception as e:
        report(rank, e)
        raise
    print("NO ERROR on rank %d after %d steps" % (rank, k), flush=True)


if __name__ == "__main__":
    body()
