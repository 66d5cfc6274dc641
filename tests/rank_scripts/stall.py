"""The stall inspector (run with small stall times by tests/mpi/test_diagnostics.py).

PTEST_STALL=idle      rank 0 submits 'stall.x' while the others sit idle (their engines
                      run no rounds): rank 0 warns, naming the tensor and the missing
                      ranks; then the others submit and it completes.
PTEST_STALL=crossed   rank 0 waits for 'stall.a', the others for 'stall.b': every rank
                      warns about the name it submitted and names the ranks without it.
PTEST_STALL=shutdown  as idle, with a stall shutdown time: every rank gets the same
                      HorovodInternalError naming 'stall.x' and the missing ranks.

The core logs to file descriptor 2; the script points it at a file to read the warnings.
"""
import os
import time

import torch

from common import check_engine_settings, expect_raises, hvd, init, main
from support.rank_script import CapturedStderr


def ranks(rs):
    return "[%s]" % ", ".join(str(r) for r in rs)


def idle(rank, size):
    with CapturedStderr() as err:
        if rank == 0:
            total = hvd.allreduce(torch.ones(3), name="stall.x", op=hvd.Sum)
        else:
            time.sleep(2.5)
            total = hvd.allreduce(torch.ones(3), name="stall.x", op=hvd.Sum)
    assert torch.all(total == size), total
    if rank == 0:
        want = "stall.x' (submitted by rank(s) [0], missing on rank(s) %s)" % ranks(range(1, size))
        assert want in err.text, err.text
    else:
        assert "stall" not in err.text, err.text  # only the ranks that submitted warn


def crossed(rank, size):
    mine, theirs = ("stall.a", "stall.b") if rank == 0 else ("stall.b", "stall.a")
    with CapturedStderr() as err:
        h = hvd.allreduce_async(torch.ones(3), name=mine, op=hvd.Sum)
        time.sleep(2.5)
        h2 = hvd.allreduce_async(torch.ones(3), name=theirs, op=hvd.Sum)
        assert torch.all(hvd.synchronize(h) == size)
        assert torch.all(hvd.synchronize(h2) == size)
    holders, missing = ([0], range(1, size)) if rank == 0 else (range(1, size), [0])
    want = "%s' (submitted by rank(s) %s, missing on rank(s) %s)" % (mine, ranks(holders), ranks(missing))
    assert want in err.text, err.text


def shutdown(rank, size):
    want = ["stalled past the stall shutdown time", "stall.x' (submitted by rank(s) [0], "
            "missing on rank(s) %s)" % ranks(range(1, size))]
    start = time.monotonic()
    if rank == 0:
        expect_raises(hvd.HorovodInternalError, "stalled allreduce", hvd.allreduce, torch.ones(3),
                      name="stall.x", contains=want, within_s=10)
        assert time.monotonic() - start < 6, time.monotonic() - start
    else:
        time.sleep(4)  # the set has stopped meanwhile: the next request fails at once
        expect_raises(hvd.HorovodInternalError, "request after the stall shutdown", hvd.allreduce,
                      torch.ones(3), name="stall.x", contains=want, within_s=2)


def body():
    rank, size = init()
    check_engine_settings()  # the test runs the cases in one process
    {"idle": idle, "crossed": crossed, "shutdown": shutdown}[os.environ["PTEST_STALL"]](rank, size)
    hvd.shutdown() if os.environ["PTEST_STALL"] != "shutdown" else None


if __name__ == "__main__":
    main(body)
