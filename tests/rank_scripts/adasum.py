"""op=Adasum: every float dtype and shape (0-d, empty), sync / async / in place / grouped,
several tensors of different sizes fused into one batch (each with its own dot products),
Adasum and Sum requests in flight together, prescale/postscale, process sets (also of a
non-power-of-two size), identical bits on every rank, joined ranks (zeros), and the local
errors (int dtype -> ValueError, reducescatter -> NotImplementedError, no gradient) after
which the engine still works.
Expected values come from tests/support/adasum_reference.py (numpy)."""
import os
import sys

import torch

from common import dtype_name, expect_raises, hvd, init, main, make_tensor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.adasum_reference import assert_adasum_close  # noqa: E402

SHAPES = [(), (0,), (1,), (17,), (5, 3), (2, 3, 4)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def np64(t):
    return t.to(torch.float64).numpy()


def check(out, xs, dtype, what, **scale):
    assert out.dtype == dtype, "%s: dtype %s, expected %s" % (what, out.dtype, dtype)
    assert_adasum_close(np64(out), [np64(x) for x in xs], dtype_name(dtype), what, **scale)


def check_same_bits(out, what, process_set=None):
    """Every rank of the set holds the very same bits."""
    kwargs = {} if process_set is None else {"process_set": process_set}
    bits = out.reshape(1, -1).view(torch.int16 if out.element_size() == 2 else torch.uint8)
    rows = hvd.allgather(bits.contiguous(), name="bits." + what, **kwargs)
    for r in range(rows.shape[0]):
        assert torch.equal(rows[r], rows[0]), "%s: rank %d's result differs from rank 0's" % (what, r)


def body():
    rank, size = init()

    # Blocking, out of place; the input stays untouched; identical bits everywhere.
    for dtype in DTYPES:
        for shape in SHAPES:
            name = "ada.%s.%s" % (dtype_name(dtype), "x".join(map(str, shape)))
            xs = [make_tensor(name, r, shape, dtype) for r in range(size)]
            mine = xs[rank].clone()
            out = hvd.allreduce(mine, name=name, op=hvd.Adasum)
            assert torch.equal(mine, xs[rank]), name + ": input modified"
            check(out, xs, dtype, name)
            check_same_bits(out, name)

    # Larger than one MPI piece when PERSEUS_CHUNK_SIZE is small.
    name = "ada.large"
    xs = [make_tensor(name, r, (5000,), torch.float32) for r in range(size)]
    out = hvd.allreduce(xs[rank], name=name, op=hvd.Adasum)
    check(out, xs, torch.float32, name)
    check_same_bits(out, name)

    # In place, and with scale factors (Adasum is not divided by the size).
    for dtype in DTYPES:
        name = "ada.inplace." + dtype_name(dtype)
        xs = [make_tensor(name, r, (9, 2), dtype) for r in range(size)]
        mine = xs[rank].clone()
        assert hvd.allreduce_(mine, name=name, op=hvd.Adasum) is mine
        check(mine, xs, dtype, name)
        name = "ada.scaled." + dtype_name(dtype)
        out = hvd.allreduce(xs[rank], name=name, op=hvd.Adasum, prescale_factor=0.5,
                            postscale_factor=3.0)
        check(out, xs, dtype, name, prescale=0.5, postscale=3.0)

    # Two closed forms the pairwise rule must give at any size: the same vector on
    # every rank comes back unchanged, orthogonal vectors are summed.
    same = torch.linspace(-2, 3, 11, dtype=torch.float64)
    assert torch.equal(hvd.allreduce(same, name="ada.same", op=hvd.Adasum), same), "ada.same"
    basis = torch.zeros(size, 3, dtype=torch.float64)
    basis[rank] = torch.tensor([1.0, -2.0, 0.5]) * (rank + 1)
    expected = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64) * torch.arange(
        1, size + 1, dtype=torch.float64).reshape(-1, 1)
    got = hvd.allreduce(basis, name="ada.orthogonal", op=hvd.Adasum)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12), "ada.orthogonal: %s" % got

    # Many tensors of different sizes and dtypes submitted at once: the ones of one
    # dtype are fused into one batch, yet each keeps its own dot products. Sum
    # requests in flight at the same time are not mixed into the Adasum batches.
    pending = []
    for i in range(12):
        dtype = DTYPES[i % len(DTYPES)]
        op = hvd.Sum if i % 3 == 2 else hvd.Adasum
        name = "ada.fused.%d" % i
        xs = [make_tensor(name, r, (3 * i + 1,), dtype) * (i + 1) for r in range(size)]
        pending.append((name, op, dtype, xs, hvd.allreduce_async(xs[rank], name=name, op=op)))
    for name, op, dtype, xs, handle in reversed(pending):
        out = hvd.synchronize(handle)
        if op == hvd.Adasum:
            check(out, xs, dtype, name)
            check_same_bits(out, name)
        else:
            expected = torch.stack([x.to(torch.float64) for x in xs]).sum(0)
            assert torch.allclose(out.to(torch.float64), expected, rtol=2e-2, atol=1e-2), \
                "%s: Sum request gave %s, expected %s" % (name, out[:4], expected[:4])

    # Grouped: one negotiation unit, one fused batch per dtype.
    for dtype in (torch.float32, torch.bfloat16):
        name = "ada.grouped." + dtype_name(dtype)
        shapes = [(4,), (), (0,), (7, 3), (33,)]
        groups = [[make_tensor("%s.%d" % (name, i), r, s, dtype) for r in range(size)]
                  for i, s in enumerate(shapes)]
        outs = hvd.grouped_allreduce([xs[rank] for xs in groups], name=name, op=hvd.Adasum)
        for i, (out, xs) in enumerate(zip(outs, groups)):
            check(out, xs, dtype, "%s[%d]" % (name, i))
            check_same_bits(out, "%s.%d" % (name, i))
        mine = [xs[rank].clone() for xs in groups]
        hvd.synchronize(hvd.grouped_allreduce_async_(mine, name=name + ".inplace", op=hvd.Adasum))
        for i, (out, xs) in enumerate(zip(mine, groups)):
            check(out, xs, dtype, "%s.inplace[%d]" % (name, i))

    # Process sets: the set's members only, in set-rank order; a set of one (its input
    # comes back), and at size 4 a set of 3.
    memberships = [[1]]
    if size >= 3:
        memberships += [[0, 1], list(range(1, size))]
    if size >= 4:
        memberships.append([0, 2])
    sets = [hvd.add_process_set(m) for m in memberships]
    for ps, members in zip(sets, memberships):
        if rank not in members:
            continue
        name = "ada.set." + "_".join(map(str, members))
        xs = [make_tensor(name, r, (6, 5), torch.float32) for r in members]
        out = hvd.allreduce(xs[members.index(rank)], name=name, op=hvd.Adasum, process_set=ps)
        check(out, xs, torch.float32, name)
        check_same_bits(out, name, process_set=ps)
    for ps in sets:
        hvd.remove_process_set(ps)

    # join(): a rank that joined counts as a zero vector, which Adasum leaves out.
    # Rank 0 joins at once; the others reduce one tensor, then join.
    if rank != 0:
        name = "ada.joined"
        xs = [make_tensor(name, r, (7,), torch.float32) for r in range(size)]
        xs[0] = torch.zeros(7)
        check(hvd.allreduce(xs[rank], name=name, op=hvd.Adasum), xs, torch.float32, name)
    hvd.join()

    # Local errors, raised at the call on every rank; nothing is sent.
    for dtype in (torch.int32, torch.int64, torch.uint8):
        expect_raises(ValueError, "Adasum of " + dtype_name(dtype), hvd.allreduce,
                      torch.ones(4, dtype=dtype), name="ada.int", op=hvd.Adasum,
                      contains=("Adasum", dtype_name(dtype)))
    expect_raises(ValueError, "grouped Adasum with an int tensor", hvd.grouped_allreduce,
                  [torch.ones(2), torch.ones(2, dtype=torch.int64)], name="ada.gint",
                  op=hvd.Adasum, contains=("Adasum", "int64"))
    expect_raises(NotImplementedError, "reducescatter Adasum", hvd.reducescatter,
                  torch.ones(4, 2), name="ada.rs", op=hvd.Adasum, contains=("Adasum",))

    # The gradient of an Adasum allreduce is refused (Adasum is not linear).
    x = torch.ones(3, requires_grad=True)
    out = hvd.allreduce(x, name="ada.grad", op=hvd.Adasum)
    expect_raises(NotImplementedError, "gradient of Adasum", out.sum().backward,
                  contains=("Adasum",))

    # The engine still works afterwards, under the names just refused.
    xs = [make_tensor("ada.after", r, (8,), torch.float32) for r in range(size)]
    check(hvd.allreduce(xs[rank], name="ada.int", op=hvd.Adasum), xs, torch.float32, "ada.after")
    hvd.shutdown()


main(body)
