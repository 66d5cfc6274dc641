"""A peer that arrives long after the others: a synchronous op's caller drives the
engine for at most 0.5 s and then hands the outstanding round to the engine thread,
which must pick it up (this once hung). Checked for synchronous and asynchronous
ops, with the last rank late by more than the driving window."""
import time

import torch

from common import hvd, init, main


def body():
    rank, size = init()
    late = rank == size - 1
    for i in range(2):
        if late:
            time.sleep(1.2)
        t = torch.full((16,), float(rank))
        hvd.broadcast_(t, root_rank=0, name="late.bcast.%d" % i)
        assert torch.all(t == 0), t
        total = hvd.allreduce(torch.full((4,), 1.0), name="late.sum.%d" % i, op=hvd.Sum)
        assert torch.all(total == size), total
    if late:
        time.sleep(1.2)
    h = hvd.allreduce_async(torch.full((4,), float(rank)), name="late.async", op=hvd.Sum)
    assert torch.all(hvd.synchronize(h) == size * (size - 1) / 2)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
