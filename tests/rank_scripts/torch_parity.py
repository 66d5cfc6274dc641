"""Horovod parity of the PyTorch front end (issue 15, issue 16 item 7), each against a
reference computed on this rank with plain torch from every rank's (reproducible)
inputs:

- sparse_allreduce_async: the reduced sparse tensor's dense form equals the sum
  (or mean) of every rank's dense form; a rank may contribute no entries;
- alltoall returns the tensor alone without splits, (tensor, received) with them;
  alltoall_async + synchronize always gives the pair (as Horovod's);
- gradients: allgather -> mean of the ranks' upstream gradients, this rank's rows;
  reducescatter -> allgather of the upstream gradients x prescale x postscale,
  x set size for op=Sum; grouped forms alike; broadcast -> mean on the root, 0 else;
- broadcast_optimizer_state on an optimizer without state initialises it (zero .grad
  where requires_grad, None elsewhere), plain and wrapped in DistributedOptimizer;
- Horovod's texts of the optimizer's warnings and errors, which scripts match;
- add_process_set of registered ranks: ValueError on every rank, nothing broken,
  and a set left behind by a failed step can be found, removed and added again;
- a tensor whose storage is replaced (set_, .data =) while its in-place request is
  in flight: no crash, no corruption, a clear error at synchronize(), and the next
  request works.
"""
import warnings

import torch
import torch.nn as nn

from common import assert_equal, expect_raises, hvd, init, log, main, make_tensor, seed_of

from perseus.common.process_sets import find_process_set
from perseus.torch.optimizer import DistributedOptimizer

FLOATS = [torch.float32, torch.float64]


def close(got, expected, what, tol=1e-5):
    assert got.shape == expected.shape, "%s: shape %s, expected %s" % (what, tuple(got.shape),
                                                                     tuple(expected.shape))
    assert torch.allclose(got.double(), expected.double(), rtol=tol, atol=tol), \
        "%s: max |diff| %.3g" % (what, float((got.double() - expected.double()).abs().max()))


# ---- sparse ---------------------------------------------------------------------

def sparse_input(tag, rank, shape, dtype):
    """rank r contributes r entries (rank 0 none), some rows repeated."""
    g = torch.Generator().manual_seed(seed_of(tag, rank))
    nnz = rank
    rows = torch.randint(0, shape[0], (nnz,), generator=g)
    values = make_tensor(tag, rank, (nnz,) + shape[1:], dtype)
    return torch.sparse_coo_tensor(rows.unsqueeze(0), values, shape, check_invariants=True)


def check_sparse(rank, size):
    for dtype in FLOATS:
        for shape in [(7,), (6, 3)]:
            for op in (hvd.Average, hvd.Sum):
                tag = "sp.%s.%d.%d" % (dtype, len(shape), op)
                inputs = [sparse_input(tag, r, shape, dtype) for r in range(size)]
                handle = hvd.sparse_allreduce_async(inputs[rank], name=tag, op=op)
                result = handle()
                assert result.is_sparse, "%s: result is not sparse" % tag
                expected = sum(x.to_dense() for x in inputs)
                if op == hvd.Average:
                    expected = expected / size
                close(result.to_dense(), expected, tag)
    # Unnamed, through the default op (Average as Horovod's optimizer passes it).
    x = sparse_input("sp.noname", rank, (5, 2), torch.float64)
    got = hvd.sparse_allreduce_async(x, None, hvd.Average)().to_dense()
    close(got, sum(sparse_input("sp.noname", r, (5, 2), torch.float64).to_dense()
                   for r in range(size)) / size, "sparse unnamed")
    expect_raises(ValueError, "sparse with Max", hvd.sparse_allreduce_async, x, "sp.max", hvd.Max,
                  contains=("Max",))


# ---- alltoall -------------------------------------------------------------------

def check_alltoall(rank, size):
    xs = [make_tensor("p.a2a", r, (2 * size, 3), torch.float32) for r in range(size)]
    expected = torch.cat([x[2 * rank:2 * rank + 2] for x in xs])
    out = hvd.alltoall(xs[rank], name="p.a2a.none")
    assert isinstance(out, torch.Tensor), "alltoall without splits returned %s" % type(out)
    assert_equal(out, expected, "alltoall without splits")
    pair = hvd.alltoall(xs[rank], splits=[2] * size, name="p.a2a.splits")
    assert isinstance(pair, tuple) and len(pair) == 2, "alltoall with splits: %r" % (pair,)
    assert_equal(pair[0], expected, "alltoall with splits")
    assert pair[1].tolist() == [2] * size, pair[1]
    for splits in (None, [2] * size):
        got = hvd.synchronize(hvd.alltoall_async(xs[rank], splits=splits,
                                                 name="p.a2a.async.%s" % (splits is None)))
        assert isinstance(got, tuple) and len(got) == 2, "alltoall_async: %r" % (got,)
        assert_equal(got[0], expected, "alltoall_async")
    # Differentiable without splits too: the tensor comes back alone.
    x = xs[rank].clone().requires_grad_(True)
    y = hvd.alltoall(x, name="p.a2a.grad")
    assert isinstance(y, torch.Tensor) and y.requires_grad
    ws = [make_tensor("p.a2a.w", r, (2 * size, 3), torch.float32) for r in range(size)]
    (y * ws[rank]).sum().backward()
    # d/dx: rows this rank sent to rank j come back with rank j's weights.
    expected_grad = torch.cat([ws[j][2 * rank:2 * rank + 2] for j in range(size)])
    close(x.grad, expected_grad, "alltoall gradient")


# ---- gradients ------------------------------------------------------------------

def rows_of(r):
    return r + 1


def check_gradients(rank, size):
    total = sum(rows_of(r) for r in range(size))
    offset = sum(rows_of(r) for r in range(rank))
    for dtype in FLOATS:
        # allgather: upstream gradient differs by rank (w_r).
        ws = [make_tensor("g.ag.w.%s" % dtype, r, (total, 3), dtype) for r in range(size)]
        x = make_tensor("g.ag", rank, (rows_of(rank), 3), dtype).requires_grad_(True)
        (hvd.allgather(x, name="g.ag.%s" % dtype) * ws[rank]).sum().backward()
        mean = sum(w.double() for w in ws) / size
        close(x.grad, mean[offset:offset + rows_of(rank)], "allgather gradient %s" % dtype)

        # grouped_allgather
        ws2 = [make_tensor("g.gag.w.%s" % dtype, r, (total, 2), dtype) for r in range(size)]
        a = make_tensor("g.gag.a", rank, (rows_of(rank), 3), dtype).requires_grad_(True)
        b = make_tensor("g.gag.b", rank, (rows_of(rank), 2), dtype).requires_grad_(True)
        ya, yb = hvd.grouped_allgather([a, b], name="g.gag.%s" % dtype)
        ((ya * ws[rank]).sum() + (yb * ws2[rank]).sum()).backward()
        mean2 = sum(w.double() for w in ws2) / size
        close(a.grad, mean[offset:offset + rows_of(rank)], "grouped_allgather gradient a")
        close(b.grad, mean2[offset:offset + rows_of(rank)], "grouped_allgather gradient b")

        # reducescatter, Sum and Average, with and without scale factors.
        n = 2 * size + 1
        out_rows = [n // size + (1 if r < n % size else 0) for r in range(size)]
        for op in (hvd.Sum, hvd.Average):
            for pre, post in ((1.0, 1.0), (0.5, 3.0)):
                tag = "g.rs.%s.%d.%g" % (dtype, op, pre)
                vs = [make_tensor(tag + ".w", r, (out_rows[r], 2), dtype) for r in range(size)]
                x = make_tensor(tag, rank, (n, 2), dtype).requires_grad_(True)
                y = hvd.reducescatter(x, name=tag, op=op, prescale_factor=pre,
                                      postscale_factor=post)
                (y * vs[rank]).sum().backward()
                scale = pre * post * (size if op == hvd.Sum else 1)
                close(x.grad, torch.cat(vs).double() * scale, "reducescatter gradient " + tag)

                # grouped
                x1 = make_tensor(tag + ".g1", rank, (n, 2), dtype).requires_grad_(True)
                x2 = make_tensor(tag + ".g2", rank, (n, 2), dtype).requires_grad_(True)
                y1, y2 = hvd.grouped_reducescatter([x1, x2], name=tag + ".g", op=op,
                                                   prescale_factor=pre, postscale_factor=post)
                ((y1 * vs[rank]).sum() + (2 * y2 * vs[rank]).sum()).backward()
                close(x1.grad, torch.cat(vs).double() * scale, "grouped reducescatter 1 " + tag)
                close(x2.grad, 2 * torch.cat(vs).double() * scale, "grouped reducescatter 2 " + tag)

        # broadcast: mean of the upstream gradients on the root, zeros elsewhere.
        root = size - 1
        ws = [make_tensor("g.bc.w.%s" % dtype, r, (4,), dtype) for r in range(size)]
        x = make_tensor("g.bc", rank, (4,), dtype).requires_grad_(True)
        (hvd.broadcast(x, root, name="g.bc.%s" % dtype) * ws[rank]).sum().backward()
        expected = sum(w.double() for w in ws) / size if rank == root else torch.zeros(4)
        close(x.grad, expected, "broadcast gradient %s" % dtype)


# ---- broadcast_optimizer_state --------------------------------------------------

def check_optimizer_state_init(rank, size):
    for wrapped in (False, True):
        torch.manual_seed(5)
        model = nn.Linear(3, 2).double()
        frozen = nn.Parameter(torch.ones(2, dtype=torch.float64), requires_grad=False)
        before = [p.detach().clone() for p in model.parameters()]
        # AdamW: its weight decay would move the parameters in the zero-gradient step.
        opt = torch.optim.AdamW(list(model.parameters()) + [frozen], lr=0.1 * (rank + 1),
                                weight_decay=0.1)
        if wrapped:
            named = list(model.named_parameters()) + [("frozen", frozen)]
            opt = DistributedOptimizer(opt, named_parameters=named)
        assert not opt.state
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        what = "broadcast_optimizer_state (wrapped=%s)" % wrapped
        for p, b in zip(model.parameters(), before):
            assert p.grad is not None and p.grad.layout is torch.strided, "%s: .grad is None" % what
            assert torch.equal(p.grad, torch.zeros_like(p)), "%s: .grad is not zero" % what
            assert torch.equal(p.detach(), b), "%s: the initialising step moved a parameter" % what
            assert int(opt.state[p]["step"]) == 1, "%s: step %s" % (what, opt.state[p]["step"])
        assert frozen.grad is None, "%s: the frozen parameter got a gradient" % what
        assert opt.param_groups[0]["lr"] == 0.1, "%s: lr %s" % (what, opt.param_groups[0]["lr"])
        # Training goes on normally afterwards (wrapped: one reduction per parameter).
        opt.zero_grad()
        model(torch.ones(4, 3, dtype=torch.float64)).sum().backward()
        opt.step()
    # Stateless (plain SGD): nothing to send, gradients still zeroed as in Horovod.
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    expect_raises(ValueError, "LBFGS", hvd.broadcast_optimizer_state,
                  torch.optim.LBFGS(model.parameters()), 0,
                  contains=("cannot broadcast torch.optim.LBFGS state",))


# ---- texts scripts match ----------------------------------------------------------

def check_texts(rank, size):
    torch.manual_seed(3)
    model = nn.Linear(3, 2).double()
    x = torch.ones(4, 3, dtype=torch.float64)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
    model(x).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    texts = [str(w.message) for w in caught]
    assert any("optimizer.step() called without optimizer.skip_synchronize()" in t
               for t in texts), "warning texts: %s" % texts
    if size > 1:
        opt.zero_grad()
        model(x).sum().backward()
        expect_raises(AssertionError, "zero_grad pending", opt.zero_grad, contains=(
            "optimizer.zero_grad() was called after loss.backward() but before "
            "optimizer.step() or optimizer.synchronize()",))
        expect_raises(AssertionError, "too many passes", lambda: model(x).sum().backward(),
                      contains=("Gradients were computed more than backward_passes_per_step "
                                "times",))
        opt.step()
    named = list(model.named_parameters())
    expect_raises(ValueError, "duplicate names", DistributedOptimizer,
                  torch.optim.SGD(model.parameters(), lr=0.1),
                  named_parameters=[("w", named[0][1]), ("w", named[1][1])],
                  contains=("Parameter names in named_parameters must be unique",))
    expect_raises(ValueError, "unnamed", DistributedOptimizer,
                  torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named[:1],
                  contains=("named_parameters was specified, but one or more model "
                            "parameters were not named",))
    expect_raises(ValueError, "predivide with Sum", DistributedOptimizer,
                  torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum,
                  gradient_predivide_factor=2.0,
                  contains=("gradient_predivide_factor not supported with op != Average",))
    sgd = torch.optim.SGD
    expect_raises(ValueError, "named_parameters not tuples", DistributedOptimizer,
                  sgd(model.parameters(), lr=0.1), named_parameters=[p for _, p in named],
                  contains=("named_parameters should be a sequence of tuples (name, parameter)",))
    expect_raises(ValueError, "groups not tensors", DistributedOptimizer,
                  sgd(model.parameters(), lr=0.1), named_parameters=named, groups=[["w"]],
                  contains=("groups must consist of torch.Tensor",))
    expect_raises(ValueError, "parameter in two groups", DistributedOptimizer,
                  sgd(model.parameters(), lr=0.1), named_parameters=named,
                  groups=[[named[0][1]], [named[0][1]]],
                  contains=("A parameter can only appear once in groups",))
    expect_raises(ValueError, "groups of a bad type", DistributedOptimizer,
                  sgd(model.parameters(), lr=0.1), named_parameters=named, groups="x",
                  contains=("groups should be a non-negative integer or a list of list of "
                            "torch.Tensor",))


# ---- process sets ---------------------------------------------------------------

def check_duplicate_sets(rank, size):
    ranks = [0] if size == 2 else [0, 1]
    ps = hvd.add_process_set(ranks)
    try:
        for again in (list(ranks), hvd.ProcessSet(ranks), ps):
            expect_raises(ValueError, "duplicate set", hvd.add_process_set, again,
                          contains=("Attempted to add a duplicate process set",))
        expect_raises(ValueError, "duplicate of the global set", hvd.add_process_set,
                      list(range(size)), contains=("duplicate process set",))
        # The registered set is untouched.
        if rank in ranks:
            got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="ps.dup", process_set=ps)
            assert_equal(got, torch.full((3,), float(len(ranks))), "set after a duplicate add")
    finally:
        hvd.remove_process_set(ps)

    # A "step" that adds a set and fails before removing it...
    try:
        hvd.add_process_set(ranks)
        raise RuntimeError("a failing step")
    except RuntimeError:
        pass
    # ...leaves a set that later code can find and remove, then add again.
    left = find_process_set(ranks)
    assert left is not None and left.ranks == ranks
    expect_raises(ValueError, "left-over set", hvd.add_process_set, ranks,
                  contains=("duplicate process set",))
    assert hvd.remove_process_set(left)
    ps = hvd.add_process_set(ranks)
    if rank in ranks:
        got = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="ps.readded", process_set=ps)
        assert_equal(got, torch.full((2,), float(len(ranks))), "re-added set")
    hvd.remove_process_set(ps)
    # Unrelated collectives are unaffected.
    assert_equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="ps.global"),
                 torch.full((2,), float(size)), "global after the set churn")


# ---- storage replaced while in flight ---------------------------------------------

N = 1 << 20  # 4 MiB of float32: allocated with mmap, so a freed block is unmapped


def check_storage_swap(rank, size):
    for how in ("set_", "data"):
        for swappers in ([0], list(range(size))):
            tag = "swap.%s.%d" % (how, len(swappers))
            t = torch.full((N,), float(rank + 1))
            handle = hvd.allreduce_async_(t, name=tag, op=hvd.Sum)
            if rank in swappers:
                replacement = torch.zeros(7)
                if how == "set_":
                    t.set_(replacement)
                else:
                    t.data = replacement
                expect_raises(ValueError, tag, hvd.synchronize, handle,
                              contains=("set_()", "in flight"))
                assert torch.equal(t, torch.zeros(7)), "%s: the new storage was written" % tag
            else:
                got = hvd.synchronize(handle)
                assert got is t
                assert_equal(t, torch.full((N,), float(size * (size + 1) // 2)), tag)
            # The next request works.
            x = torch.full((5,), float(rank))
            hvd.allreduce_(x, op=hvd.Sum, name=tag + ".next")
            assert_equal(x, torch.full((5,), float(size * (size - 1) // 2)), tag + " next")
    # Shrinking resize_ keeps the memory: the result lands, no error.
    t = torch.full((N,), float(rank + 1))
    handle = hvd.allreduce_async_(t, name="swap.shrink", op=hvd.Sum)
    t.resize_(N // 2)
    hvd.synchronize(handle)
    assert_equal(t, torch.full((N // 2,), float(size * (size + 1) // 2)), "shrinking resize_")
    # Out-of-place: the input's memory is kept while it is read.
    t = torch.full((N,), float(rank + 1))
    handle = hvd.allreduce_async(t, name="swap.input", op=hvd.Sum)
    t.set_(torch.zeros(3))
    assert_equal(hvd.synchronize(handle), torch.full((N,), float(size * (size + 1) // 2)),
                 "input replaced")


def body():
    rank, size = init()
    for check in (check_sparse, check_alltoall, check_gradients, check_optimizer_state_init,
                  check_texts, check_duplicate_sets, check_storage_swap):
        check(rank, size)
        if rank == 0:
            log("%s ok" % check.__name__)
    hvd.shutdown()


main(body)
