"""reducescatter, reducescatter_async, grouped_reducescatter, grouped_reducescatter_async:
Sum and Average (the default) on every dtype, even and uneven first dimensions (the first
dim0 % size ranks get one extra row; ranks may get none), prescale/postscale."""
import torch

from common import (DTYPES, FLOAT_DTYPES, assert_close, assert_unchanged, dtype_name, hvd, init, main,
                    make_tensor, op_name, reference_reduce, split_rows)

TRAILING = [(), (3,), (2, 2)]
OPS = [hvd.Sum, hvd.Average]


def dims(size):
    """First dimensions: even, uneven, fewer rows than ranks, one short of size."""
    return sorted({3 * size, 2 * size + 1, 1, size - 1, size + 1})


def expected_slice(inputs, op, dtype, rank, size, **scale):
    expected, bound = reference_reduce(inputs, op, dtype, **scale)
    rows = split_rows(inputs[0].shape[0], size)
    start = sum(rows[:rank])
    sl = slice(start, start + rows[rank])
    return expected[sl], (None if bound is None else bound[sl])


def check(out, inputs, op, dtype, rank, size, what, **scale):
    expected, bound = expected_slice(inputs, op, dtype, rank, size, **scale)
    assert_close(out, expected, bound, dtype, what)


def body():
    rank, size = init()
    pending = []
    for op in OPS:
        for dtype in DTYPES:
            for dim0 in dims(size):
                for trailing in TRAILING:
                    shape = (dim0,) + trailing
                    name = "rs.%s.%s.%s" % (op_name(op), dtype_name(dtype), "x".join(map(str, shape)))
                    xs = [make_tensor(name, r, shape, dtype) for r in range(size)]
                    mine = xs[rank].clone()
                    out = hvd.reducescatter(mine, name=name, op=op)
                    assert_unchanged(mine, xs[rank], name)
                    check(out, xs, op, dtype, rank, size, name)

                    name += ".async"
                    xs = [make_tensor(name, r, shape, dtype) for r in range(size)]
                    pending.append((hvd.reducescatter_async(xs[rank], name=name, op=op), xs, op, dtype, name))
    for handle, xs, op, dtype, name in reversed(pending):
        check(hvd.synchronize(handle), xs, op, dtype, rank, size, name)

    # prescale / postscale.
    for dtype in FLOAT_DTYPES:
        for op in OPS:
            name = "rs.scale.%s.%s" % (op_name(op), dtype_name(dtype))
            xs = [make_tensor(name, r, (2 * size + 1, 3), dtype) for r in range(size)]
            out = hvd.reducescatter(xs[rank], name=name, op=op, prescale_factor=0.5, postscale_factor=3.0)
            check(out, xs, op, dtype, rank, size, name, prescale=0.5, postscale=3.0)

    # The default op is Average.
    for dtype in (torch.float32, torch.int32):
        name = "rs.default." + dtype_name(dtype)
        xs = [make_tensor(name, r, (2 * size, 2), dtype) for r in range(size)]
        check(hvd.reducescatter(xs[rank], name=name), xs, hvd.Average, dtype, rank, size, name)

    # Grouped, blocking and asynchronous: tensors of different first dimensions.
    pending = []
    for op in OPS:
        for dtype in DTYPES:
            for asynchronous in (False, True):
                name = "grs.%s.%s%s" % (op_name(op), dtype_name(dtype), ".async" if asynchronous else "")
                shapes = [(d, 2) for d in dims(size)]
                groups = [[make_tensor("%s.%d" % (name, i), r, shape, dtype) for r in range(size)]
                          for i, shape in enumerate(shapes)]
                mine = [xs[rank] for xs in groups]
                if asynchronous:
                    pending.append((hvd.grouped_reducescatter_async(mine, name=name, op=op), groups, op, dtype, name))
                    continue
                outs = list(hvd.grouped_reducescatter(mine, name=name, op=op))
                assert len(outs) == len(groups), name
                for i, (out, xs) in enumerate(zip(outs, groups)):
                    check(out, xs, op, dtype, rank, size, "%s[%d]" % (name, i))
    for handle, groups, op, dtype, name in pending:
        outs = list(hvd.synchronize(handle))
        assert len(outs) == len(groups), name
        for i, (out, xs) in enumerate(zip(outs, groups)):
            check(out, xs, op, dtype, rank, size, "%s[%d]" % (name, i))
    hvd.shutdown()


main(body)
