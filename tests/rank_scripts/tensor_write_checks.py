"""What torch.distributed's collectives do to the tensors they write, as gloo does it: the
same checks for the drop-in (distributed_api.py, `dist` = perseus.torch.distributed) and
the "perseus" backend (torch_backend.py, `dist` = torch.distributed).

- A leaf that requires grad (a parameter a script broadcasts at start-up) is written in
  place outside no_grad; its version counter moves, so a backward that needs the value
  it had raises autograd's error instead of using the new one.
- is_completed() true means the outputs are in place, without wait().
- wait(timeout) running out while a peer is late raises a RuntimeError (as gloo's), also
  a TimeoutError; the collective stays pending and completes once the peer comes.
- Bool tensors reduce logically, as gloo's: SUM, MAX and BOR give "any", PRODUCT, MIN and
  BAND "all", BXOR the parity (all_reduce, sync and async, strided; reduce;
  reduce_scatter_tensor; reduce_scatter), against any()/all()/the count's parity over
  every rank's input; AVG on bool is refused on every rank before anything is sent.
  Sparse COO tensors, float and bool, are summed (all_reduce).
- Integer tensors (uint8 to int64, the full range of each) reduce bitwise by BAND, BOR
  and BXOR (all_reduce, small and large, async, every dtype in flight at once; reduce;
  reduce_scatter_tensor), against torch's bitwise ops over every rank's input;
  on a float tensor they are refused, naming the op.
"""
import functools
import datetime
import time

import torch

from common import (assert_equal, assert_reduced, expect_raises, hvd, make_tensor, seed_of, touch,
                    wait_for)

ANY, ALL, PARITY = ("SUM", "MAX", "BOR"), ("PRODUCT", "MIN", "BAND"), ("BXOR",)
BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}
INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def check_tensor_writes(dist, rank, size, tag):
    xs = [make_tensor(tag + ".leaf", r, (3,), torch.float64) for r in range(size)]
    w = torch.nn.Parameter(xs[rank].clone())
    loss = (w * w).sum()  # saves w for its backward
    version = w._version
    dist.broadcast(w, src=size - 1)
    assert_equal(w.detach(), xs[size - 1], tag + ": broadcast into a parameter")
    assert w.is_leaf and w.requires_grad and w._version > version, \
        "%s: a leaf %s, version %d -> %d" % (tag, w.is_leaf, version, w._version)
    expect_raises(RuntimeError, tag + ": backward through the overwritten value", loss.backward,
                  contains=("modified by an inplace operation",))
    dist.all_reduce(w)
    assert_reduced(w.detach(), [xs[size - 1]] * size, hvd.Sum, torch.float64,
                   tag + ": all_reduce of a parameter")

    xs = [make_tensor(tag + ".poll", r, (2, 3), torch.float32) for r in range(size)]
    out = [torch.zeros(2, 3) for _ in range(size)]
    work = dist.all_gather(out, xs[rank], async_op=True)
    _until_completed(work)
    for r in range(size):
        assert_equal(out[r], xs[r], "%s: all_gather's output %d once is_completed()" % (tag, r))
    base = torch.stack([xs[rank], xs[rank]], 2)
    strided = base[..., 1]  # reduced through a contiguous copy, written back at the end
    work = dist.all_reduce(strided, async_op=True)
    _until_completed(work)
    assert_reduced(strided, xs, hvd.Sum, torch.float32, tag + ": strided all_reduce once "
                   "is_completed()")

    t = torch.ones(2)
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        error = expect_raises(RuntimeError, tag + ": wait(timeout) with the peers late",
                              work.wait, datetime.timedelta(seconds=0.2))
        assert isinstance(error, TimeoutError), type(error).__mro__
        touch(tag + ".rank0.waited")
        assert work.wait() and torch.equal(t, torch.full((2,), float(size)))
    else:
        wait_for(tag + ".rank0.waited")
        dist.all_reduce(t)


def check_bool_reductions(dist, rank, size, tag):
    def flags(what, r, shape):
        g = torch.Generator().manual_seed(seed_of("%s.%s" % (tag, what), r))
        return torch.rand(shape, generator=g) < 0.5

    for name in ANY + ALL + PARITY:
        op = getattr(dist.ReduceOp, name)
        xs = [flags(name, r, (size, 5)) for r in range(size)]
        stacked = torch.stack(xs)
        expected = (stacked.any(0) if name in ANY else stacked.all(0) if name in ALL
                    else stacked.sum(0) % 2 == 1)
        what = "%s: bool all_reduce %s" % (tag, name)
        t = xs[rank].clone()
        dist.all_reduce(t, op=op)
        assert_equal(t, expected, what)
        t = xs[rank].clone()
        dist.all_reduce(t, op=op, async_op=True).wait()
        assert_equal(t, expected, what + " async")
        strided = torch.stack([xs[rank].t(), xs[rank].t()], 2)[..., 0]
        dist.all_reduce(strided, op=op)
        assert_equal(strided, expected.t(), what + " strided")
        t = xs[rank].clone()
        dist.reduce(t, dst=size - 1, op=op)
        assert_equal(t, expected if rank == size - 1 else xs[rank], what + " reduce")
        out = torch.zeros(5, dtype=torch.bool)
        dist.reduce_scatter_tensor(out, xs[rank].flatten(), op=op)
        assert_equal(out, expected.flatten()[rank * 5:(rank + 1) * 5],
                     what + " reduce_scatter_tensor")
        out = torch.zeros(5, dtype=torch.bool)
        dist.reduce_scatter(out, list(xs[rank].unbind(0)), op=op)
        assert_equal(out, expected[rank], what + " reduce_scatter")
    t = torch.ones(2, dtype=torch.bool)
    expect_raises(NotImplementedError, tag + ": AVG on bool", dist.all_reduce, t,
                  op=dist.ReduceOp.AVG, contains=("ReduceOp.AVG",))
    t = torch.ones(3, dtype=torch.bool)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)  # the calls line up again
    assert t.all()
    # Sparse COO (SUM only, as gloo): summed as it is, bool values too (logically).
    for dtype in (torch.float64, torch.bool):
        dense = [(flags("sparse", r, (4, 3)) & flags("sparse.mask", r, (4, 3))).to(dtype)
                 for r in range(size)]
        t = dense[rank].to_sparse()
        dist.all_reduce(t)
        expected = sum(d.double() for d in dense)
        expected = expected.bool() if dtype is torch.bool else expected
        assert_equal(t.to_dense(), expected, "%s: sparse %s all_reduce" % (tag, dtype))


def check_bitwise_reductions(dist, rank, size, tag):
    def ints(what, r, dtype, n):
        info = torch.iinfo(dtype)
        g = torch.Generator().manual_seed(seed_of("%s.%s" % (tag, what), r))
        return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)

    for name, fold in BITWISE.items():
        op = getattr(dist.ReduceOp, name)
        for dtype in INTEGERS:
            what = "%s: %s all_reduce of %s" % (tag, name, dtype)
            for n in (7, 40000):  # in the negotiation round; a fused buffer of its own
                xs = [ints("%s.%s.%d" % (name, dtype, n), r, dtype, n) for r in range(size)]
                expected = functools.reduce(fold, xs)
                t = xs[rank].clone()
                if n > 7:
                    dist.all_reduce(t, op=op, async_op=True).wait()
                else:
                    dist.all_reduce(t, op=op)
                assert_equal(t, expected, "%s (%d)" % (what, n))
            t = xs[rank].clone()
            dist.reduce(t, dst=0, op=op)
            assert_equal(t, expected if rank == 0 else xs[rank], what + " reduce")
            out = torch.empty(n // size, dtype=dtype)
            dist.reduce_scatter_tensor(out, xs[rank][:n - n % size], op=op)
            assert_equal(out, expected[rank * (n // size):(rank + 1) * (n // size)],
                         what + " reduce_scatter_tensor")
        xs = {dtype: [ints(name + ".coalesced", r, dtype, 9) for r in range(size)]
              for dtype in INTEGERS}
        ts = [x[rank].clone() for x in xs.values()]
        for work in [dist.all_reduce(t, op=op, async_op=True) for t in ts]:
            work.wait()
        for t, x in zip(ts, xs.values()):
            assert_equal(t, functools.reduce(fold, x), "%s: %s all_reduce, every dtype in flight"
                         % (tag, name))
        expect_raises(RuntimeError, "%s: %s on float32" % (tag, name), dist.all_reduce,
                      torch.ones(2), op=op, contains=(name, "integer"))


def _until_completed(work):
    deadline = time.monotonic() + 60
    while not work.is_completed():
        assert time.monotonic() < deadline, "is_completed() stayed false for 60 s"
        time.sleep(0.001)
    assert work.is_success(), work.exception()
