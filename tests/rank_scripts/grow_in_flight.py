"""A tensor grown (resize_() to 100x, or an out= op) while its request is in flight
(issue 16 item 7). torch reallocates a growing storage in place and frees the old
memory at once. The test runs with MALLOC_MMAP_THRESHOLD_ low (tests/mpi/test_failures.py),
so freed memory is unmapped and an engine still using it would crash the process
(SIGSEGV without the pin: the 1 MiB tensors here, and the 100x they grow to).

Every round, on some ranks (rank 0, or all: the plan is the same on every rank):
- the growing resize_() raises torch's "not resizable" RuntimeError on the caller's
  thread (perseus.torch.keepalive pins the storage while in flight);
- the request completes on every rank with the reference result (plain torch
  from every rank's reproducible inputs) in the tensor's first elements;
- after synchronize() the tensor has the shape it was resized to, over memory of
  that size (keepalive grows it: torch set the shape before it refused), and grows again;
- nothing stays pinned, also after a request that failed.
In place and out of place, allreduce / broadcast / allgather / reducescatter, several
dtypes and shapes, views of one storage in two requests at once.
"""
import warnings

import torch

from common import (assert_equal, assert_reduced, expect_raises, hvd, init, log, main,
                    make_tensor)

from perseus.torch import keepalive

GROWTH = 100
ROUNDS = 4
SHAPES = [(1 << 18,), (64, 33), (3, 5, 7)]
DTYPES = [torch.float32, torch.float64, torch.int32, torch.bfloat16]


def grow(t, how):
    """The caller's misuse: grows t in place; must be refused while in flight."""
    if how == "resize_":
        t.resize_(t.numel() * GROWTH)
    else:  # an out= op resizes its output when the shape differs
        torch.add(torch.zeros(t.numel() * GROWTH, dtype=t.dtype), 1, out=t)


def refused(t, how, tag):
    expect_raises(RuntimeError, tag, grow, t, how, contains=("not resizable",))


def check_after(t, numel, tag):
    """Shape is torch's new one, memory fits it, and it is resizable again."""
    assert t.numel() == numel * GROWTH, (tag, t.shape)
    needed = (t.storage_offset() + t.numel()) * t.element_size()
    assert t.untyped_storage().nbytes() >= needed, (tag, t.untyped_storage().nbytes(), needed)
    assert t.untyped_storage().resizable(), tag
    t.view(-1)[-1] = 1  # the last element: would fault past the memory


def check_allreduce(rank, size, rnd, growers, how, inplace):
    for shape in SHAPES:
        for dtype in DTYPES:
            tag = "grow.ar.%d.%s.%s.%s.%s" % (rnd, how, inplace, "x".join(map(str, shape)),
                                            str(dtype)[6:])
            inputs = [make_tensor(tag, r, shape, dtype) for r in range(size)]
            t = inputs[rank].clone()
            numel = t.numel()
            if inplace:
                handle = hvd.allreduce_async_(t, name=tag, op=hvd.Sum)
            else:
                handle = hvd.allreduce_async(t, name=tag, op=hvd.Sum)
            if rank in growers:
                refused(t, how, tag)
            got = hvd.synchronize(handle)
            if inplace:
                assert got is t
                got = t.flatten()[:numel].view(shape)
            assert_reduced(got, inputs, hvd.Sum, dtype, tag)
            if rank in growers:
                check_after(t, numel, tag)


def check_data_movement(rank, size, rnd, growers):
    # Broadcast in place, allgather and reducescatter inputs grown in flight.
    tag = "grow.bc.%d" % rnd
    root = rnd % size
    t = make_tensor(tag, rank, (1000,), torch.float32)
    handle = hvd.broadcast_async_(t, root, name=tag)
    if rank in growers:
        refused(t, "resize_", tag)
    hvd.synchronize(handle)
    assert_equal(t.flatten()[:1000], make_tensor(tag, root, (1000,), torch.float32), tag)

    tag = "grow.ag.%d" % rnd
    t = make_tensor(tag, rank, (50, 3), torch.float64)
    handle = hvd.allgather_async(t, name=tag)
    if rank in growers:
        refused(t, "resize_", tag)
    assert_equal(hvd.synchronize(handle),
                 torch.cat([make_tensor(tag, r, (50, 3), torch.float64) for r in range(size)]),
                 tag)

    tag = "grow.rs.%d" % rnd
    inputs = [make_tensor(tag, r, (size * 40, 2), torch.int64) for r in range(size)]
    t = inputs[rank].clone()
    handle = hvd.reducescatter_async(t, name=tag, op=hvd.Sum)
    if rank in growers:
        refused(t, "resize_", tag)
    assert_equal(hvd.synchronize(handle), sum(inputs)[rank * 40:(rank + 1) * 40], tag)


def check_shared_storage(rank, size, rnd):
    # Two requests over views of one flat buffer: the first synchronize must not
    # unpin what the second still uses.
    tag = "grow.flat.%d" % rnd
    flat = torch.full((2000,), float(rank + 1))
    first, second = flat[:1000], flat[1000:]
    h1 = hvd.allreduce_async_(first, name=tag + ".a", op=hvd.Sum)
    h2 = hvd.allreduce_async_(second, name=tag + ".b", op=hvd.Sum)
    hvd.synchronize(h1)
    assert not flat.untyped_storage().resizable(), "unpinned while a view is in flight"
    refused(flat, "resize_", tag)
    hvd.synchronize(h2)
    total = float(size * (size + 1) // 2)
    assert_equal(flat[:2000], torch.full((2000,), total), tag)
    assert flat.untyped_storage().resizable()


def check_failed_request_unpins(rank, size):
    # Shapes differ across ranks: an error on every rank, and the pin is released.
    t = torch.ones(10 + rank)
    handle = hvd.allreduce_async_(t, name="grow.mismatch", op=hvd.Sum)
    expect_raises(Exception, "mismatch", hvd.synchronize, handle)
    assert keepalive.pinned_count() == 0, keepalive.pinned_count()
    assert t.untyped_storage().resizable()


def body():
    rank, size = init()
    # torch's deprecation notice for out= resizing, once per shape: noise here.
    warnings.filterwarnings("ignore", "An output with one or more elements was resized")
    for rnd in range(ROUNDS):
        growers = [0] if rnd % 2 == 0 else list(range(size))
        for how in ("resize_", "out="):
            for inplace in (True, False):
                check_allreduce(rank, size, rnd, growers, how, inplace)
        check_data_movement(rank, size, rnd, growers)
        check_shared_storage(rank, size, rnd)
        assert keepalive.pinned_count() == 0, keepalive.pinned_count()
        if rank == 0:
            log("round %d ok" % rnd)
    check_failed_request_unpins(rank, size)
    # The engine still works.
    x = torch.full((5,), float(rank))
    hvd.allreduce_(x, op=hvd.Sum, name="grow.next")
    assert_equal(x, torch.full((5,), float(size * (size - 1) // 2)), "next")
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
