"""Complex tensors through torch.distributed's calls, as torch and gloo take them: the
same checks for the drop-in (distributed_api.py, `dist` = perseus.torch.distributed)
and the "perseus" backend (torch_backend.py, `dist` = torch.distributed), each result
against one computed here from every rank's input.

torch's own functions pass most calls to a backend as real views (torch.view_as_real),
but not reduce, gather, reduce_scatter or send and recv, which gloo takes complex; the
drop-in views none itself. Reductions other than sum and average are refused, as torch
refuses them for all_reduce (max of 2+3i and 3+2i is not 3+3i).
"""
import torch

from common import expect_raises, seed_of

DTYPES = (torch.complex64, torch.complex128)


def inputs(tag, rank, shape, dtype):
    """Rank `rank`'s input: small integers in both parts, so every sum and average over
    up to 4 ranks is exact in any order."""
    g = torch.Generator().manual_seed(seed_of("%s %s" % (tag, dtype), rank))
    parts = torch.randint(-8, 9, (2,) + tuple(shape), generator=g).double()
    return torch.complex(parts[0], parts[1]).to(dtype)


def equal(got, expected, what):
    assert got.dtype == expected.dtype and got.shape == expected.shape, \
        "%s: %s %s, expected %s %s" % (what, got.dtype, tuple(got.shape), expected.dtype,
                                       tuple(expected.shape))
    assert torch.equal(got, expected), "%s: %s, expected %s" % (what, got.flatten()[:4].tolist(),
                                                                expected.flatten()[:4].tolist())


def check_complex(dist, rank, size):
    last = size - 1
    for dtype in DTYPES:
        for shape in ((size * 2, 3), (size,)):
            what = "%s %s" % (dtype, shape)
            xs = [inputs(what, r, shape, dtype) for r in range(size)]
            mine, total = xs[rank], sum(xs)
            t = mine.clone()
            dist.all_reduce(t)
            equal(t, total, "all_reduce " + what)
            t = mine.clone()
            dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True).wait()
            equal(t, total / size, "async all_reduce AVG " + what)
            t = mine.clone()
            dist.reduce(t, dst=last)
            equal(t, total if rank == last else mine, "reduce " + what)
            t = mine.clone()
            dist.broadcast(t, src=last)
            equal(t, xs[last], "broadcast " + what)
            rows = [torch.empty_like(mine) for _ in range(size)]
            dist.all_gather(rows, mine)
            for r in range(size):
                equal(rows[r], xs[r], "all_gather row %d %s" % (r, what))
            out = torch.empty((size,) + shape, dtype=dtype)
            dist.all_gather_into_tensor(out, mine)
            equal(out, torch.stack(xs), "all_gather_into_tensor " + what)
            chunk = shape[0] // size
            out = torch.empty((chunk,) + shape[1:], dtype=dtype)
            dist.reduce_scatter_tensor(out, mine)
            equal(out, total[rank * chunk:(rank + 1) * chunk], "reduce_scatter_tensor " + what)
            out = torch.empty_like(mine)
            dist.reduce_scatter(out, [mine * (j + 1) for j in range(size)])
            equal(out, total * (rank + 1), "reduce_scatter " + what)
            rows = [torch.empty_like(mine) for _ in range(size)] if rank == 0 else None
            dist.gather(mine, rows, dst=0)
            if rank == 0:
                for r in range(size):
                    equal(rows[r], xs[r], "gather row %d %s" % (r, what))
            out = torch.empty_like(mine)
            dist.scatter(out, [x + r for r, x in enumerate(xs)] if rank == last else None,
                         src=last)
            equal(out, xs[rank] + rank, "scatter " + what)
            out = torch.empty_like(mine)
            dist.all_to_all_single(out, mine)
            expected = torch.cat([x[rank * chunk:(rank + 1) * chunk] for x in xs])
            equal(out, expected, "all_to_all_single " + what)
            if size > 1:
                out = torch.empty_like(mine)
                after, before = (rank + 1) % size, (rank - 1) % size
                if rank % 2 == 0:
                    dist.send(mine, after)
                    dist.recv(out, before)
                else:
                    dist.recv(out, before)
                    dist.send(mine, after)
                equal(out, xs[before], "send and recv " + what)
    # Refused on every rank before anything is sent, so the calls after it line up.
    t = inputs("refused", rank, (3,), torch.complex64)
    for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        expect_raises(ValueError, "all_reduce %s of a complex tensor" % op, dist.all_reduce,
                      t.clone(), op=op, contains=("does not support", "on complex tensors"))
    expect_raises(ValueError, "reduce MAX of a complex tensor", dist.reduce, t.clone(), dst=0,
                  op=dist.ReduceOp.MAX, contains=("reduce does not support ReduceOp.MAX on "
                                                  "complex tensors",))
    t2 = t.clone()
    dist.all_reduce(t2)
    equal(t2, sum(inputs("refused", r, (3,), torch.complex64) for r in range(size)),
          "all_reduce after the refusals")
