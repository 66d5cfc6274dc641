"""Grouped collectives with a different number of tensors on different ranks fail on
every rank, within about a second, naming the group sizes; before, the rank with fewer
tensors returned success and the other waited for the rest forever. The group's name
works again afterwards.
"""
import torch

from common import assert_equal, assert_reduced, expect_raises, hvd, init, main, make_tensor

BOUND_S = 5.0


def inputs(name, count, rank, size):
    return [[make_tensor("%s.%d" % (name, i), r, (i + 2, 3), torch.float32) for r in range(size)]
            for i in range(count)]


def run(kind, name, count, rank, size):
    xs = inputs(name, count, rank, size)
    mine = [x[rank] for x in xs]
    if kind == "allreduce":
        outs = hvd.grouped_allreduce(mine, name=name, op=hvd.Sum)
        for out, x in zip(outs, xs):
            assert_reduced(out, x, hvd.Sum, torch.float32, name)
    else:
        outs = hvd.grouped_allgather(mine, name=name)
        for out, x in zip(outs, xs):
            assert_equal(out, torch.cat(x), name)
    assert len(outs) == count


def body():
    rank, size = init()
    for kind in ("allreduce", "allgather"):
        for extra_rank in (size - 1, 0):  # the larger group on the last rank, then on the first
            name = "grp.%s.%d" % (kind, extra_rank)
            count = 3 if rank == extra_rank else 2
            want = ["group size (tensors in the grouped call)", name]
            expect_raises(hvd.HorovodInternalError, "%s of %d tensors" % (name, count), run, kind,
                          name, count, rank, size, contains=want, within_s=BOUND_S)
            run(kind, name, 3, rank, size)  # the same name, the same group everywhere
    # A grouped call against a plain one of a member's name: also a mismatch.
    expect_raises(hvd.HorovodInternalError, "group against single",
                  lambda: (hvd.grouped_allreduce([torch.ones(2), torch.ones(2)], name="grp.single")
                           if rank == 0 else hvd.allreduce(torch.ones(2), name="grp.single.0")),
                  contains=["group size"], within_s=BOUND_S)
    run("allreduce", "grp.single", 2, rank, size)
    # Unnamed groups: the same, and the unnamed requests after them still line up.
    for _ in range(2):
        expect_raises(hvd.HorovodInternalError, "unnamed groups of different sizes",
                      lambda: hvd.grouped_allreduce([torch.ones(2)] * (3 if rank == 0 else 2)),
                      contains=["group size"], within_s=BOUND_S)
        run("allreduce", None, 2, rank, size)
        x = make_tensor("unnamed", rank, (4,), torch.float32)
        assert_reduced(hvd.allreduce(x, op=hvd.Sum),
                       [make_tensor("unnamed", r, (4,), torch.float32) for r in range(size)],
                       hvd.Sum, torch.float32, "unnamed allreduce after the groups")
    hvd.shutdown()


main(body)
