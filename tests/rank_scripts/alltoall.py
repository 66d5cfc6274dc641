"""alltoall and alltoall_async on every dtype (bool included): even splits (splits=None)
with first dimensions that differ per rank, explicit splits (as a list, an int32 and an
int64 tensor) with zeros among them, and the received splits."""
import torch

from common import (DTYPES_WITH_BOOL, assert_equal, assert_unchanged, dtype_name, hvd, init, main,
                    make_tensor, seed_of)

TRAILING = [(), (3,), (2, 2), (4, 0)]


def random_splits(name, sender, size):
    """How many rows `sender` sends to each rank under `name` (zeros included)."""
    g = torch.Generator().manual_seed(seed_of(name + ".splits", sender))
    return torch.randint(0, 4, (size,), generator=g).tolist()


def expected_alltoall(inputs, splits_of, rank):
    """What `rank` receives: from each sender, the rows that sender addressed to it."""
    pieces, received = [], []
    for sender, x in enumerate(inputs):
        splits = splits_of[sender]
        start = sum(splits[:rank])
        pieces.append(x[start:start + splits[rank]])
        received.append(splits[rank])
    return torch.cat(pieces), received


def unpack(result, splits_given, what):
    """Horovod returns (output, received_splits) when splits are given; with splits=None
    it returns the output alone. Both forms are accepted for splits=None."""
    if isinstance(result, (tuple, list)):
        assert len(result) == 2, "%s: expected (output, received_splits), got %d items" % (what, len(result))
        return result[0], result[1]
    assert not splits_given, "%s: splits were given but no received_splits came back" % what
    return result, None


def check(result, inputs, splits_of, rank, splits_given, what):
    out, received = unpack(result, splits_given, what)
    expected, expected_received = expected_alltoall(inputs, splits_of, rank)
    assert_equal(out, expected, what)
    if received is not None:
        got = [int(v) for v in (received.tolist() if isinstance(received, torch.Tensor) else received)]
        assert got == expected_received, "%s: received splits %s, expected %s" % (what, got, expected_received)


def body():
    rank, size = init()
    pending = []
    for dtype in DTYPES_WITH_BOOL:
        for trailing in TRAILING:
            tag = "%s.%s" % (dtype_name(dtype), "x".join(map(str, trailing)))

            # splits=None: each rank's first dimension is a multiple of size (not the same one).
            name = "a2a.even." + tag
            per_dest = [1 + (r % 3) for r in range(size)]
            splits_of = [[per_dest[r]] * size for r in range(size)]
            xs = [make_tensor(name, r, (per_dest[r] * size,) + trailing, dtype) for r in range(size)]
            mine = xs[rank].clone()
            check(hvd.alltoall(mine, name=name), xs, splits_of, rank, False, name)
            assert_unchanged(mine, xs[rank], name)

            # Explicit splits, given three ways.
            for form in ("list", "int32", "int64"):
                name = "a2a.splits.%s.%s" % (form, tag)
                splits_of = [random_splits(name, r, size) for r in range(size)]
                xs = [make_tensor(name, r, (sum(splits_of[r]),) + trailing, dtype) for r in range(size)]
                splits = splits_of[rank]
                if form != "list":
                    splits = torch.tensor(splits, dtype=getattr(torch, form))
                mine = xs[rank].clone()
                check(hvd.alltoall(mine, splits=splits, name=name), xs, splits_of, rank, True, name)
                assert_unchanged(mine, xs[rank], name)

            # Asynchronous, all in flight together; synchronize gives (output, received_splits).
            name = "a2a.async." + tag
            splits_of = [random_splits(name, r, size) for r in range(size)]
            xs = [make_tensor(name, r, (sum(splits_of[r]),) + trailing, dtype) for r in range(size)]
            handle = hvd.alltoall_async(xs[rank], splits=torch.tensor(splits_of[rank], dtype=torch.int32),
                                        name=name)
            pending.append((handle, xs, splits_of, name))
    for handle, xs, splits_of, name in reversed(pending):
        check(hvd.synchronize(handle), xs, splits_of, rank, True, name)

    # Nothing sent at all.
    xs = [make_tensor("a2a.nothing", r, (0, 3), torch.float32) for r in range(size)]
    check(hvd.alltoall(xs[rank], splits=[0] * size, name="a2a.nothing"),
          xs, [[0] * size] * size, rank, True, "a2a.nothing")

    # Everything to one rank.
    target = size - 1
    splits_of = [[3 if d == target else 0 for d in range(size)] for _ in range(size)]
    xs = [make_tensor("a2a.funnel", r, (3, 2), torch.int64) for r in range(size)]
    check(hvd.alltoall(xs[rank], splits=splits_of[rank], name="a2a.funnel"),
          xs, splits_of, rank, True, "a2a.funnel")
    hvd.shutdown()


main(body)
