"""join(): ranks run out of work at different times. Ranks that joined contribute zeros to
the allreduces the others still do, and join() returns the last rank to join, on every
rank. Two rounds with opposite orders, then normal collectives again."""
import torch

from common import assert_reduced, dtype_name, hvd, init, main, make_tensor

DTYPES = [torch.float32, torch.int64, torch.float16]


def join_round(tag, steps_of, rank, size):
    """Rank r does steps_of[r] allreduces named tag.<step>.<dtype>, then joins. At step i
    only ranks with more than i steps submit; the others have joined and count as zeros."""
    for step in range(steps_of[rank]):
        active = [r for r in range(size) if steps_of[r] > step]
        for dtype in DTYPES:
            name = "%s.%d.%s" % (tag, step, dtype_name(dtype))
            xs = {r: make_tensor(name, r, (6, 2), dtype) for r in active}
            out = hvd.allreduce(xs[rank], name=name, op=hvd.Sum)
            zeros = [torch.zeros_like(xs[rank])] * (size - len(active))
            assert_reduced(out, list(xs.values()) + zeros, hvd.Sum, dtype,
                           "%s with ranks %s active" % (name, active))
        # A small and a large tensor fused: the large one skips the fusion buffer, and a
        # joined rank's zeros must take the same MPI calls.
        name = "%s.%d.mixed" % (tag, step)
        shapes = [(6, 2), (80000,)]
        xs = {r: [make_tensor("%s.%d" % (name, i), r, s, torch.float32) for i, s in enumerate(shapes)]
              for r in active}
        outs = hvd.grouped_allreduce(xs[rank], name=name, op=hvd.Sum)
        for i, out in enumerate(outs):
            zeros = [torch.zeros(shapes[i])] * (size - len(active))
            assert_reduced(out, [xs[r][i] for r in active] + zeros, hvd.Sum, torch.float32,
                           "%s[%d] with ranks %s active" % (name, i, active))
    return hvd.join()


def body():
    rank, size = init()

    # Round 1: rank r does r + 1 steps, so the highest rank joins last.
    last = join_round("join.up", [r + 1 for r in range(size)], rank, size)
    assert last == size - 1, "round 1: join() returned %r, the last to join was %d" % (last, size - 1)

    # Round 2: the reverse, rank 0 joins last.
    last = join_round("join.down", [size - r for r in range(size)], rank, size)
    assert last == 0, "round 2: join() returned %r, the last to join was 0" % (last,)

    # Everyone back: ordinary collectives see all ranks' data again.
    name = "join.after"
    xs = [make_tensor(name, r, (5,), torch.float32) for r in range(size)]
    assert_reduced(hvd.allreduce(xs[rank], name=name, op=hvd.Sum), xs, hvd.Sum, torch.float32, name)
    hvd.shutdown()


main(body)
