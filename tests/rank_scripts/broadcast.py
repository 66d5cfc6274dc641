"""broadcast, broadcast_, broadcast_async, broadcast_async_ from every root rank, on every
dtype (bool included) and shapes from 0-d to empty."""
import time

from common import (DTYPES_WITH_BOOL, assert_equal, assert_unchanged, dtype_name, hvd, init, main,
                    make_tensor)

SHAPES = [(), (0,), (7,), (3, 4), (2, 0, 3)]


def cases(tag, size, shapes=SHAPES):
    for root in range(size):
        for dtype in DTYPES_WITH_BOOL:
            for shape in shapes:
                yield "%s.%d.%s.%s" % (tag, root, dtype_name(dtype), "x".join(map(str, shape))), root, dtype, shape


def body():
    rank, size = init()

    # Blocking, out of place: everyone gets the root's tensor, no input changes.
    for name, root, dtype, shape in cases("bc.blocking", size):
        mine = make_tensor(name, rank, shape, dtype)
        before = mine.clone()
        out = hvd.broadcast(mine, root, name=name)
        assert_unchanged(mine, before, name)
        assert_equal(out, make_tensor(name, root, shape, dtype), name)

    # In place, blocking.
    for name, root, dtype, shape in cases("bc.inplace", size, [(), (7,), (3, 4)]):
        mine = make_tensor(name, rank, shape, dtype)
        out = hvd.broadcast_(mine, root, name=name)
        expected = make_tensor(name, root, shape, dtype)
        assert_equal(mine, expected, name + " (input tensor)")
        assert_equal(out, expected, name + " (returned tensor)")

    # Everything in flight at once, out of place and in place.
    pending = []
    for name, root, dtype, shape in cases("bc.async", size):
        mine = make_tensor(name, rank, shape, dtype)
        pending.append((hvd.broadcast_async(mine, root, name=name), mine, mine.clone(), name, root, dtype, shape, False))
    for name, root, dtype, shape in cases("bc.async_", size):
        mine = make_tensor(name, rank, shape, dtype)
        pending.append((hvd.broadcast_async_(mine, root, name=name), mine, None, name, root, dtype, shape, True))
    for handle, mine, before, name, root, dtype, shape, inplace in reversed(pending):
        while not hvd.poll(handle):
            time.sleep(0.0005)
        out = hvd.synchronize(handle)
        expected = make_tensor(name, root, shape, dtype)
        assert_equal(out, expected, name)
        if inplace:
            assert_equal(mine, expected, name + " (input tensor)")
        else:
            assert_unchanged(mine, before, name)

    # Unnamed broadcasts pair up by call order.
    for i in range(2 * size):
        root = i % size
        mine = make_tensor("bc.unnamed.%d" % i, rank, (5,), DTYPES_WITH_BOOL[i % 9])
        assert_equal(hvd.broadcast(mine, root),
                     make_tensor("bc.unnamed.%d" % i, root, (5,), DTYPES_WITH_BOOL[i % 9]),
                     "unnamed broadcast #%d" % i)
    hvd.shutdown()


main(body)
