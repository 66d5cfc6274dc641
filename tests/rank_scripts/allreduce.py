"""allreduce, allreduce_, allreduce_async, allreduce_async_ on every op x dtype x shape,
prescale/postscale, the deprecated `average=` argument, the default op, unnamed requests,
one name reused under changing settings (allreduce_'s packed requests), and the local
argument errors (bool -> ValueError, Adasum of an int -> ValueError;
Adasum itself is checked in adasum.py)."""
import time
import warnings

import torch

from common import (DTYPES, FLOAT_DTYPES, assert_reduced, assert_unchanged, dtype_name,
                    expect_raises, hvd, init, kind_for, main, make_tensor, op_name)

from perseus.torch import adapter

SHAPES = [(), (0,), (1,), (17,), (5, 3), (2, 3, 4), (3, 0)]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def cases(tag):
    for op in OPS:
        for dtype in DTYPES:
            for shape in SHAPES:
                name = "%s.%s.%s.%s" % (tag, op_name(op), dtype_name(dtype), "x".join(map(str, shape)))
                yield name, op, dtype, shape


def inputs_for(name, op, dtype, shape, size):
    return [make_tensor(name, r, shape, dtype, kind_for(op)) for r in range(size)]


def body():
    rank, size = init()

    # Blocking, out of place: a new tensor, the input untouched.
    for name, op, dtype, shape in cases("ar.blocking"):
        xs = inputs_for(name, op, dtype, shape, size)
        mine = xs[rank].clone()
        out = hvd.allreduce(mine, name=name, op=op)
        assert_unchanged(mine, xs[rank], name)
        assert_reduced(out, xs, op, dtype, name)

    # Everything submitted asynchronously at once (fusion), awaited in reverse order.
    pending = []
    for name, op, dtype, shape in cases("ar.async"):
        xs = inputs_for(name, op, dtype, shape, size)
        mine = xs[rank].clone()
        pending.append((hvd.allreduce_async(mine, name=name, op=op), mine, xs, name, op, dtype))
    for handle, mine, xs, name, op, dtype in reversed(pending):
        out = hvd.synchronize(handle)
        assert_unchanged(mine, xs[rank], name)
        assert_reduced(out, xs, op, dtype, name)

    # In place, blocking: the input holds the result.
    for name, op, dtype, shape in cases("ar.inplace"):
        if shape not in [(), (17,), (2, 3, 4)]:
            continue
        xs = inputs_for(name, op, dtype, shape, size)
        mine = xs[rank].clone()
        out = hvd.allreduce_(mine, name=name, op=op)
        assert_reduced(mine, xs, op, dtype, name + " (input tensor)")
        assert_reduced(out, xs, op, dtype, name + " (returned tensor)")

    # In place, asynchronous, completion observed through poll().
    pending = []
    for name, op, dtype, shape in cases("ar.async_inplace"):
        xs = inputs_for(name, op, dtype, shape, size)
        mine = xs[rank].clone()
        pending.append((hvd.allreduce_async_(mine, name=name, op=op), mine, xs, name, op, dtype))
    for handle, mine, xs, name, op, dtype in pending:
        while not hvd.poll(handle):
            time.sleep(0.0005)
        hvd.synchronize(handle)
        assert_reduced(mine, xs, op, dtype, name)

    # prescale / postscale on float dtypes, Sum and Average, sync and async.
    pending = []
    for dtype in FLOAT_DTYPES:
        for op in (hvd.Sum, hvd.Average):
            for shape in [(), (17,), (4, 5)]:
                for pre, post in [(0.5, 3.0), (2.0, 0.25), (1.0, -1.5)]:
                    name = "ar.scale.%s.%s.%s.%g.%g" % (op_name(op), dtype_name(dtype), shape, pre, post)
                    xs = inputs_for(name, op, dtype, shape, size)
                    out = hvd.allreduce(xs[rank].clone(), name=name, op=op,
                                        prescale_factor=pre, postscale_factor=post)
                    assert_reduced(out, xs, op, dtype, name, prescale=pre, postscale=post)
                    name += ".async"
                    xs = inputs_for(name, op, dtype, shape, size)
                    h = hvd.allreduce_async(xs[rank].clone(), name=name, op=op,
                                            prescale_factor=pre, postscale_factor=post)
                    pending.append((h, xs, op, dtype, name, pre, post))
    for h, xs, op, dtype, name, pre, post in pending:
        assert_reduced(hvd.synchronize(h), xs, op, dtype, name, prescale=pre, postscale=post)

    # Integers beyond 2**53 must not pass through a double.
    for dtype in (torch.int32, torch.int64):
        for op in (hvd.Sum, hvd.Min, hvd.Max):
            name = "ar.big.%s.%s" % (op_name(op), dtype_name(dtype))
            xs = [make_tensor(name, r, (33,), dtype, "big") for r in range(size)]
            assert_reduced(hvd.allreduce(xs[rank], name=name, op=op), xs, op, dtype, name)

    # Horovod defaults: op=None means Average; average=True/False is the old spelling.
    for dtype in (torch.float32, torch.int32):
        xs = inputs_for("ar.default." + dtype_name(dtype), hvd.Sum, dtype, (9,), size)
        assert_reduced(hvd.allreduce(xs[rank], name="ar.default." + dtype_name(dtype)),
                       xs, hvd.Average, dtype, "allreduce default op")
        xs = inputs_for("ar.avg_true." + dtype_name(dtype), hvd.Sum, dtype, (9,), size)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = hvd.allreduce(xs[rank], average=True, name="ar.avg_true." + dtype_name(dtype))
        assert [str(w.message) for w in caught] == [  # Horovod's text: scripts filter by it
            "Parameter `average` has been replaced with `op` and will be removed in v1.0"], \
            [str(w.message) for w in caught]
        assert_reduced(out, xs, hvd.Average, dtype, "allreduce average=True")
        xs = inputs_for("ar.avg_false." + dtype_name(dtype), hvd.Sum, dtype, (9,), size)
        assert_reduced(hvd.allreduce(xs[rank], average=False, name="ar.avg_false." + dtype_name(dtype)),
                       xs, hvd.Sum, dtype, "allreduce average=False")

    # Unnamed requests: every rank issues them in the same order and they must pair up.
    for i in range(20):
        dtype = [torch.float32, torch.int64, torch.float64][i % 3]
        xs = inputs_for("ar.unnamed.%d" % i, hvd.Sum, dtype, (i + 1,), size)
        if i % 2:
            out = hvd.synchronize(hvd.allreduce_async(xs[rank].clone(), op=hvd.Sum))
        else:
            out = hvd.allreduce(xs[rank].clone(), op=hvd.Sum)
        assert_reduced(out, xs, hvd.Sum, dtype, "unnamed allreduce #%d" % i)

    # The same name again and again (the negotiation cache), with fresh data each time.
    for i in range(10):
        xs = inputs_for("ar.repeat.%d" % i, hvd.Sum, torch.float32, (64,), size)
        out = hvd.allreduce(xs[rank], name="ar.repeat", op=hvd.Sum)
        assert_reduced(out, xs, hvd.Sum, torch.float32, "ar.repeat iteration %d" % i)

    # One name for in-place blocking calls of changing dtype, shape, op and scales, and
    # back (allreduce_ reuses a name's packed request while they stay the same), a
    # transposed view under that name (not contiguous: reduced in a copy), and many
    # fresh names (the store of packed requests stays bounded).
    settings = [(torch.float32, (64,), hvd.Sum, 1.0, 1.0), (torch.float64, (64,), hvd.Sum, 1.0, 1.0),
                (torch.float32, (8, 3), hvd.Sum, 1.0, 1.0), (torch.float32, (64,), hvd.Max, 1.0, 1.0),
                (torch.float32, (64,), hvd.Sum, 0.5, 3.0), (torch.int32, (5,), hvd.Min, 1.0, 1.0)]
    for i in range(3 * len(settings)):
        dtype, shape, op, pre, post = settings[i % len(settings)]
        name = "ar.reused.%d" % i
        xs = inputs_for(name, op, dtype, shape, size)
        mine = xs[rank].clone()
        assert hvd.allreduce_(mine, name="ar.reused", op=op, prescale_factor=pre,
                              postscale_factor=post) is mine
        assert_reduced(mine, xs, op, dtype, name, prescale=pre, postscale=post)
    xs = inputs_for("ar.reused.t", hvd.Sum, torch.float32, (4, 16), size)
    mine = xs[rank].clone().t()
    assert hvd.allreduce_(mine, name="ar.reused", op=hvd.Sum) is mine
    assert_reduced(mine, [x.t() for x in xs], hvd.Sum, torch.float32, "ar.reused transposed")
    limit, adapter._PACKED_REQUESTS_LIMIT = adapter._PACKED_REQUESTS_LIMIT, 100  # cheaper here
    try:
        for i in range(adapter._PACKED_REQUESTS_LIMIT + 10):
            one = torch.full((1,), float(rank + i))
            hvd.allreduce_(one, name="ar.fresh.%d" % i, op=hvd.Sum)
            assert one.item() == sum(r + i for r in range(size)), (i, one)
        assert len(adapter._packed_requests) <= adapter._PACKED_REQUESTS_LIMIT
    finally:
        adapter._PACKED_REQUESTS_LIMIT = limit
    for _ in range(2):  # refused each time, not remembered
        expect_raises(ValueError, "allreduce_ of bool", hvd.allreduce_,
                      torch.ones(4, dtype=torch.bool), name="ar.bool_", op=hvd.Sum)

    # Local argument errors, raised at the call on every rank.
    expect_raises(ValueError, "allreduce of bool", hvd.allreduce,
                  torch.ones(4, dtype=torch.bool), name="ar.bool", op=hvd.Sum)
    expect_raises(ValueError, "Adasum of int32", hvd.allreduce,
                  torch.ones(4, dtype=torch.int32), name="ar.adasum", op=hvd.Adasum,
                  contains=("Adasum", "int32"))

    # The engine still works after the rejected requests.
    xs = inputs_for("ar.after_errors", hvd.Sum, torch.float32, (8,), size)
    assert_reduced(hvd.allreduce(xs[rank], name="ar.after_errors", op=hvd.Sum),
                   xs, hvd.Sum, torch.float32, "allreduce after local errors")
    hvd.shutdown()


main(body)
