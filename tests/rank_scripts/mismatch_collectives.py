"""The same name submitted as different collectives on different ranks (an allreduce
on one, an allgather or a broadcast on another) is a mismatch: HorovodInternalError
on every rank, within about a second, naming the tensor and each rank's collective;
the name works again afterwards. Before, the wire names differed ("allreduce.x" vs
"allgather.x") and the ranks waited for each other until the stall warning.

Ranks that submit both collectives under one name, in different orders, are not a
mismatch: both complete.
"""
import time

import torch

from common import assert_equal, assert_reduced, expect_raises, hvd, init, main, make_tensor

BOUND_S = 5.0  # "about a second", with room for an oversubscribed machine


def submit(kind, name, rank, size):
    """Rank `rank`'s collective `kind` under `name`, synchronously."""
    x = make_tensor(name, rank, (size, 2), torch.float32)
    if kind == "allreduce":
        return hvd.allreduce(x, name=name, op=hvd.Sum)
    if kind == "allgather":
        return hvd.allgather(x, name=name)
    if kind == "broadcast":
        return hvd.broadcast(x, 0, name=name)
    if kind == "reducescatter":
        return hvd.reducescatter(x, name=name, op=hvd.Sum)
    raise AssertionError(kind)


def check(kind, name, got, size, rank):
    xs = [make_tensor(name, r, (size, 2), torch.float32) for r in range(size)]
    if kind == "allreduce":
        assert_reduced(got, xs, hvd.Sum, torch.float32, name)
    elif kind == "allgather":
        assert_equal(got, torch.cat(xs), name)
    elif kind == "broadcast":
        assert_equal(got, xs[0], name)
    else:
        assert_reduced(got, [x[rank:rank + 1] for x in xs], hvd.Sum, torch.float32, name)


def crossed(name, kinds, rank, size):
    """Rank r submits kinds[r % len(kinds)]; every rank must get the same error."""
    mine = kinds[rank % len(kinds)]
    used = {}
    for r in range(size):
        used.setdefault(kinds[r % len(kinds)], []).append(r)
    want = ["Mismatched collectives for tensor '%s'" % name]
    want += ["%s on rank(s) [%s]" % (k, ", ".join(map(str, rs))) for k, rs in used.items()]
    expect_raises(hvd.HorovodInternalError, "%s (%s here)" % (name, mine), submit, mine, name,
                  rank, size, contains=want, within_s=BOUND_S)
    # The name works again, for any collective every rank agrees on.
    for kind in kinds:
        check(kind, name, submit(kind, name, rank, size), size, rank)


def both_in_any_order(name, rank, size):
    """Every rank submits an allreduce and an allgather named `name`, in an order that
    differs by rank: two requests, both complete."""
    xs = [make_tensor(name, r, (3, 2), torch.float32) for r in range(size)]
    order = ["allreduce", "allgather"] if rank % 2 == 0 else ["allgather", "allreduce"]
    handles = {}
    for kind in order:
        if kind == "allreduce":
            handles[kind] = hvd.allreduce_async(xs[rank], name=name, op=hvd.Sum)
        else:
            handles[kind] = hvd.allgather_async(xs[rank], name=name)
        time.sleep(0.2)  # long enough for rounds to see the crossed halves
    assert_reduced(hvd.synchronize(handles["allreduce"]), xs, hvd.Sum, torch.float32, name)
    assert_equal(hvd.synchronize(handles["allgather"]), torch.cat(xs), name)


def body():
    rank, size = init()
    crossed("xop.ar_ag", ["allreduce", "allgather"], rank, size)
    crossed("xop.ag_bc", ["allgather", "broadcast"], rank, size)
    crossed("xop.three", ["allreduce", "broadcast", "allgather"], rank, size)
    crossed("xop.rs_ar", ["reducescatter", "allreduce"], rank, size)
    both_in_any_order("xop.both", rank, size)
    crossed("xop.ar_ag", ["allgather", "allreduce"], rank, size)  # again, after success
    hvd.shutdown()


main(body)
