"""A name submitted again while its first request is still in flight raises ValueError at
the call, and the first request still completes with the right result.

"In flight" is guaranteed, not hoped for: one rank holds back its submission (waiting on
files, outside the library) until every other rank has made its duplicate attempt.
"""
import torch

from common import assert_reduced, expect_raises, hvd, init, main, make_tensor, touch, wait_for


def duplicate_round(name, holder, rank, size, submit_first, submit_again):
    """Ranks other than `holder` submit `name`, check that a second submission is refused
    while the first waits for `holder`, and signal; `holder` submits once they all did."""
    others = [r for r in range(size) if r != holder]
    if rank == holder:
        for r in others:
            wait_for("%s.tried.%d" % (name, r))
        return submit_first()
    handle = submit_first()
    expect_raises(ValueError, name + " submitted twice", submit_again)
    touch("%s.tried.%d" % (name, rank))
    return handle


def body():
    rank, size = init()
    last = size - 1

    # Round 1: the last rank holds back; round 2: rank 0 does, so every rank (the last
    # one included) meets the duplicate while its own request is in flight.
    checks = []
    for name, holder in (("dup.allreduce.a", last), ("dup.allreduce.b", 0)):
        xs = [make_tensor(name, r, (10,), torch.float32) for r in range(size)]
        handle = duplicate_round(
            name, holder, rank, size,
            lambda: hvd.allreduce_async(xs[rank].clone(), name=name, op=hvd.Sum),
            lambda: hvd.allreduce_async(torch.full((10,), 1000.0), name=name, op=hvd.Sum))
        checks.append((handle, xs, name))

    for handle, xs, name in checks:
        assert_reduced(hvd.synchronize(handle), xs, hvd.Sum, xs[0].dtype, name + " (first submission)")

    # Once complete, the name is free again.
    for name in ("dup.allreduce.a", "dup.allreduce.b"):
        xs = [make_tensor(name + ".again", r, (3,), torch.float32) for r in range(size)]
        assert_reduced(hvd.allreduce(xs[rank], name=name, op=hvd.Sum), xs, hvd.Sum, torch.float32, name + " again")
    hvd.shutdown()


main(body)
