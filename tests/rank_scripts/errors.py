"""Requests the ranks disagree on: mismatched shape, dtype, reduce op, root rank, prescale
or postscale for the same name raise HorovodInternalError (a RuntimeError) naming the
tensor on EVERY rank, in bounded time, and the engine keeps working afterwards.

(As in Horovod, a request is identified by its collective and its name: an allreduce and
an allgather both named "x", submitted by every rank, are two different requests. One
rank's allreduce against another's allgather is a mismatch: mismatch_collectives.py.)
"""
import torch

from common import assert_equal, assert_reduced, expect_raises, hvd, init, main, make_tensor


def mismatches(rank, size):
    """(name, call) pairs; in each, one rank's request differs from the others'."""
    odd = rank == size - 1  # the rank that disagrees (the first one in some cases)
    first = rank == 0
    f32 = torch.ones(4)
    return [
        ("mm.ar.shape", lambda n: hvd.allreduce(torch.ones(3 if first else 4), name=n, op=hvd.Sum)),
        ("mm.ar.rank_of_shape", lambda n: hvd.allreduce(torch.ones(2, 2) if odd else f32, name=n, op=hvd.Sum)),
        ("mm.ar.dtype", lambda n: hvd.allreduce(f32.double() if odd else f32, name=n, op=hvd.Sum)),
        ("mm.ar.op", lambda n: hvd.allreduce(f32, name=n, op=hvd.Max if first else hvd.Sum)),
        ("mm.ar.prescale", lambda n: hvd.allreduce(f32, name=n, op=hvd.Sum, prescale_factor=2.0 if odd else 1.0)),
        ("mm.ar.postscale", lambda n: hvd.allreduce(f32, name=n, op=hvd.Sum, postscale_factor=0.5 if first else 1.0)),
        ("mm.ar.async", lambda n: hvd.synchronize(hvd.allreduce_async(torch.ones(5 if odd else 6), name=n, op=hvd.Sum))),
        ("mm.gar.shape", lambda n: hvd.grouped_allreduce([f32, torch.ones(2 if odd else 3)], name=n, op=hvd.Sum)),
        ("mm.bc.root", lambda n: hvd.broadcast(f32, 1 if odd else 0, name=n)),
        ("mm.bc.shape", lambda n: hvd.broadcast(torch.ones(5 if first else 4), 0, name=n)),
        ("mm.bc.dtype", lambda n: hvd.broadcast(f32.int() if odd else f32, 0, name=n)),
        ("mm.ag.trailing", lambda n: hvd.allgather(torch.ones(2, 4 if odd else 3), name=n)),
        ("mm.ag.dtype", lambda n: hvd.allgather(torch.ones(2, 3, dtype=torch.int64 if first else torch.int32), name=n)),
        ("mm.a2a.dtype", lambda n: hvd.alltoall(torch.ones(size, dtype=torch.float16 if odd else torch.float32), name=n)),
        ("mm.rs.shape", lambda n: hvd.reducescatter(torch.ones(size, 2 if odd else 3), name=n, op=hvd.Sum)),
    ]


def reuse(name, rank, size):
    """A correct request of the same collective under a name that failed before."""
    kind = name.split(".")[1]
    xs = [make_tensor(name + ".reuse", r, (size, 2), torch.float32) for r in range(size)]
    what = name + " reused"
    if kind == "ar":
        assert_reduced(hvd.allreduce(xs[rank], name=name, op=hvd.Sum), xs, hvd.Sum, torch.float32, what)
    elif kind == "gar":
        outs = hvd.grouped_allreduce([xs[rank], xs[rank] * 2], name=name, op=hvd.Sum)
        assert_reduced(outs[0], xs, hvd.Sum, torch.float32, what)
        assert_reduced(outs[1], [x * 2 for x in xs], hvd.Sum, torch.float32, what)
    elif kind == "bc":
        assert_equal(hvd.broadcast(xs[rank], size - 1, name=name), xs[size - 1], what)
    elif kind == "ag":
        assert_equal(hvd.allgather(xs[rank], name=name), torch.cat(xs), what)
    elif kind == "a2a":
        out = hvd.alltoall(xs[rank], splits=[1] * size, name=name)[0]
        assert_equal(out, torch.stack([x[rank] for x in xs]), what)
    elif kind == "rs":
        out = hvd.reducescatter(xs[rank], name=name, op=hvd.Sum)
        assert_reduced(out, [x[rank:rank + 1] for x in xs], hvd.Sum, torch.float32, what)
    else:
        raise AssertionError("no reuse check for " + name)


def body():
    rank, size = init()

    for name, call in mismatches(rank, size):
        e = expect_raises(hvd.HorovodInternalError, name, call, name, contains=[name], within_s=30)
        assert isinstance(e, RuntimeError), "%s: HorovodInternalError is not a RuntimeError" % name

    # A name that has been agreed before (cached) still gets checked, then works again.
    xs = [make_tensor("mm.cached", r, (4,), torch.float32) for r in range(size)]
    for _ in range(3):
        assert_reduced(hvd.allreduce(xs[rank], name="mm.cached", op=hvd.Sum), xs, hvd.Sum, torch.float32, "mm.cached")
    expect_raises(hvd.HorovodInternalError, "mm.cached mismatch", hvd.allreduce,
                  torch.ones(5 if rank == 0 else 4), name="mm.cached", op=hvd.Sum,
                  contains=["mm.cached"], within_s=30)
    assert_reduced(hvd.allreduce(xs[rank], name="mm.cached", op=hvd.Sum), xs, hvd.Sum, torch.float32,
                   "mm.cached after the mismatch")

    # Every failed name can be used again, correctly this time, by the same collective.
    for name, _ in mismatches(rank, size):
        reuse(name, rank, size)
    hvd.shutdown()


main(body)
