"""allgather, allgather_async, grouped_allgather, grouped_allgather_async on every dtype
(bool included), first dimensions that differ per rank (zero rows included) and several
trailing shapes."""
import torch

from common import (DTYPES_WITH_BOOL, assert_equal, assert_unchanged, dtype_name, hvd, init, main,
                    make_tensor)

TRAILING = [(), (3,), (2, 3), (2, 0)]


def rows_patterns(size):
    """Per-rank first dimensions: all different; some ranks empty; all empty."""
    return {
        "distinct": [r + 1 for r in range(size)],
        "some_empty": [0 if r % 2 == 0 else r + 2 for r in range(size)],
        "all_empty": [0] * size,
    }


def inputs_for(name, rows, trailing, dtype):
    return [make_tensor(name, r, (n,) + trailing, dtype) for r, n in enumerate(rows)]


def body():
    rank, size = init()
    pending = []
    for dtype in DTYPES_WITH_BOOL:
        for pattern, rows in rows_patterns(size).items():
            for trailing in TRAILING:
                name = "ag.%s.%s.%s" % (dtype_name(dtype), pattern, "x".join(map(str, trailing)))
                xs = inputs_for(name, rows, trailing, dtype)
                mine = xs[rank].clone()
                out = hvd.allgather(mine, name=name)
                assert_unchanged(mine, xs[rank], name)
                assert_equal(out, torch.cat(xs), name)

                name += ".async"
                xs = inputs_for(name, rows, trailing, dtype)
                pending.append((hvd.allgather_async(xs[rank].clone(), name=name), xs, name))
    for handle, xs, name in reversed(pending):
        assert_equal(hvd.synchronize(handle), torch.cat(xs), name)

    # Grouped: one group per dtype, its tensors with different trailing shapes.
    pending = []
    for dtype in DTYPES_WITH_BOOL:
        rows = [r + 1 for r in range(size)]
        name = "gag.%s" % dtype_name(dtype)
        groups = [inputs_for("%s.%d" % (name, i), rows, trailing, dtype)
                  for i, trailing in enumerate(TRAILING)]
        outs = list(hvd.grouped_allgather([xs[rank] for xs in groups], name=name))
        assert len(outs) == len(groups), name
        for i, (out, xs) in enumerate(zip(outs, groups)):
            assert_equal(out, torch.cat(xs), "%s[%d]" % (name, i))

        name += ".async"
        groups = [inputs_for("%s.%d" % (name, i), rows, trailing, dtype)
                  for i, trailing in enumerate(TRAILING)]
        pending.append((hvd.grouped_allgather_async([xs[rank] for xs in groups], name=name), groups, name))
    for handle, groups, name in pending:
        outs = list(hvd.synchronize(handle))
        assert len(outs) == len(groups), name
        for i, (out, xs) in enumerate(zip(outs, groups)):
            assert_equal(out, torch.cat(xs), "%s[%d]" % (name, i))

    # Unnamed allgathers pair up by call order.
    for i in range(5):
        xs = inputs_for("ag.unnamed.%d" % i, [r + i for r in range(size)], (2,), torch.float32)
        assert_equal(hvd.allgather(xs[rank]), torch.cat(xs), "unnamed allgather #%d" % i)
    hvd.shutdown()


main(body)
