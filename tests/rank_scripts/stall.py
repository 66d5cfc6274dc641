"""The stall inspector (run with small stall times by tests/mpi/test_diagnostics.py).

PTEST_STALL=idle      rank 0 submits 'stall.x' while the others sit idle (their engines
                      run no rounds): rank 0 warns, naming the tensor and the missing
                      ranks, within WARN_WITHIN_S; then the others submit and it completes.
PTEST_STALL=crossed   rank 0 waits for 'stall.a', the others for 'stall.b': every rank
                      warns (within WARN_WITHIN_S) about the name it submitted and names
                      the ranks without it; then each submits the other name.
PTEST_STALL=shutdown  as idle, with a stall shutdown time: every rank gets the same
                      HorovodInternalError naming 'stall.x' and the missing ranks.

The ranks wait for each other's warnings and errors (files in PTEST_TMPDIR), not for
fixed times (CI time, issue 50): the bounds are those the sleeps of 2.5 s and 4 s set.

The core logs to file descriptor 2; the script points it at a file to read the warnings.
"""
import os
import time

import torch

from common import check_engine_settings, expect_raises, hvd, init, main, touch, wait_for
from support.rank_script import CapturedStderr


WARN_WITHIN_S = 2.5  # the check time is 1 s: a warning by then, or the test fails


def ranks(rs):
    return "[%s]" % ", ".join(str(r) for r in rs)


def idle(rank, size):
    want = "stall.x' (submitted by rank(s) [0], missing on rank(s) %s)" % ranks(range(1, size))
    with CapturedStderr() as err:
        if rank == 0:
            handle = hvd.allreduce_async(torch.ones(3), name="stall.x", op=hvd.Sum)
            err.wait_for_text(want, WARN_WITHIN_S)
            touch("idle.warned")
            total = hvd.synchronize(handle)
        else:
            wait_for("idle.warned")  # rank 0 warned (or failed, ending the job)
            total = hvd.allreduce(torch.ones(3), name="stall.x", op=hvd.Sum)
    assert torch.all(total == size), total
    if rank == 0:
        assert want in err.text, err.text
    else:
        assert "stall" not in err.text, err.text  # only the ranks that submitted warn


def crossed(rank, size):
    mine, theirs = ("stall.a", "stall.b") if rank == 0 else ("stall.b", "stall.a")
    holders, missing = ([0], range(1, size)) if rank == 0 else (range(1, size), [0])
    want = "%s' (submitted by rank(s) %s, missing on rank(s) %s)" % (mine, ranks(holders), ranks(missing))
    with CapturedStderr() as err:
        h = hvd.allreduce_async(torch.ones(3), name=mine, op=hvd.Sum)
        err.wait_for_text(want, WARN_WITHIN_S)
        touch("crossed.warned.%d" % rank)
        for other in range(size):  # no rank submits the other name before all warned
            wait_for("crossed.warned.%d" % other)
        h2 = hvd.allreduce_async(torch.ones(3), name=theirs, op=hvd.Sum)
        assert torch.all(hvd.synchronize(h) == size)
        assert torch.all(hvd.synchronize(h2) == size)
    assert want in err.text, err.text


def shutdown(rank, size):
    want = ["stalled past the stall shutdown time", "stall.x' (submitted by rank(s) [0], "
            "missing on rank(s) %s)" % ranks(range(1, size))]
    start = time.monotonic()
    if rank == 0:
        expect_raises(hvd.HorovodInternalError, "stalled allreduce", hvd.allreduce, torch.ones(3),
                      name="stall.x", contains=want, within_s=10)
        assert time.monotonic() - start < 6, time.monotonic() - start
        touch("shutdown.stopped")
    else:
        # The set stopped in the round that failed rank 0's request: the next request
        # fails at once (the bound of rank 0's error: the sleep of 4 s this wait replaced).
        wait_for("shutdown.stopped", timeout_s=6)
        expect_raises(hvd.HorovodInternalError, "request after the stall shutdown", hvd.allreduce,
                      torch.ones(3), name="stall.x", contains=want, within_s=2)


def body():
    rank, size = init()
    check_engine_settings()  # the test runs the cases in one process
    {"idle": idle, "crossed": crossed, "shutdown": shutdown}[os.environ["PTEST_STALL"]](rank, size)
    hvd.shutdown() if os.environ["PTEST_STALL"] != "shutdown" else None


if __name__ == "__main__":
    main(body)
