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
  BAND "all" (all_reduce, sync and async, strided; reduce; reduce_scatter_tensor;
  reduce_scatter), against any()/all() over every rank's input; AVG and BXOR on bool,
  and BAND on an int tensor, are refused on every rank before anything is sent. Sparse
  COO tensors, float and bool, are summed (all_reduce).
"""
import datetime
import time

import torch

from common import (assert_equal, assert_reduced, expect_raises, hvd, make_tensor, seed_of, touch,
                    wait_for)

ANY, ALL = ("SUM", "MAX", "BOR"), ("PRODUCT", "MIN", "BAND")


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

    for name in ANY + ALL:
        op = getattr(dist.ReduceOp, name)
        xs = [flags(name, r, (size, 5)) for r in range(size)]
        stacked = torch.stack(xs)
        expected = stacked.any(0) if name in ANY else stacked.all(0)
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
    refused = (("AVG", torch.bool), ("BXOR", torch.bool), ("BAND", torch.int32))
    for name, dtype in refused:
        t = torch.ones(2, dtype=dtype)
        expect_raises(NotImplementedError, "%s: %s on %s" % (tag, name, t.dtype), dist.all_reduce,
                      t, op=getattr(dist.ReduceOp, name), contains=("ReduceOp.%s" % name,))
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


def _until_completed(work):
    deadline = time.monotonic() + 60
    while not work.is_completed():
        assert time.monotonic() < deadline, "is_completed() stayed false for 60 s"
        time.sleep(0.001)
    assert work.is_success(), work.exception()
