"""DistributedOptimizer: data-parallel training on per-rank slices of a batch equals
single-process training on the whole batch.

Every rank builds the same float64 model and the same full batch (pure functions of
fixed seeds), computes the single-process reference itself with plain torch on the
whole batch, trains the distributed copy on its own slice, and compares the weights
after STEPS steps; the weights must also be bit-identical on every rank. Variants:
backward_passes_per_step=2, groups and num_groups, gradient_predivide_factor, fp16 and
bf16 compression (looser tolerance, and they must differ from the exact result, so the
wire dtype really changed), synchronize() + skip_synchronize() with gradient
clipping, Adam, op=Sum, a parameter without gradient, sparse gradients (reduced
sparse, as Horovod, and with sparse_as_dense). Then the error cases: duplicate/missing
names, zero_grad() while reductions are pending, gradient_predivide_factor with
Adasum, a sparse gradient in a group without sparse_as_dense.
(op=Adasum itself: adasum_optimizer.py.)
"""
import copy
import warnings

import torch
import torch.nn as nn

from common import expect_raises, hvd, init, log, main

from perseus.torch.compression import Compression
from perseus.torch.optimizer import DistributedOptimizer
from perseus.torch.optimizer_mixin import _IN_BUCKET

STEPS = 30
BATCH = 24  # divisible by 2 and 4 ranks, and by 2 micro-batches per rank
TOL = 1e-9


class Net(nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.fc1 = nn.Linear(5, 8)
        self.fc2 = nn.Linear(8, 3)
        if unused:
            self.spare = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class EmbedNet(nn.Module):
    def __init__(self, sparse):
        super().__init__()
        self.emb = nn.Embedding(10, 4, sparse=sparse)
        self.fc = nn.Linear(4, 3)

    def forward(self, idx):
        return self.fc(self.emb(idx))


def make_model(cls=Net, **kwargs):
    torch.manual_seed(1234)
    return cls(**kwargs).double()


def batch():
    g = torch.Generator().manual_seed(99)
    x = torch.randn(BATCH, 5, generator=g, dtype=torch.float64)
    y = torch.randn(BATCH, 3, generator=g, dtype=torch.float64)
    return x, y


def embed_batch():
    g = torch.Generator().manual_seed(7)
    idx = torch.randint(0, 10, (BATCH,), generator=g)
    y = torch.randn(BATCH, 3, generator=g, dtype=torch.float64)
    return idx, y


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def sparse_adam(model):
    # SparseAdam takes sparse gradients only: the embedding's (fc stays as it is).
    return torch.optim.SparseAdam(list(model.emb.parameters()), lr=0.05)


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=0.01)


def loss_fn(out, y):
    return ((out - y) ** 2).mean()


def reference(make_opt=sgd, clip=None, model_kwargs=None, data=batch, model_cls=Net):
    """Plain torch, one process, the whole batch."""
    model = make_model(model_cls, **(model_kwargs or {}))
    opt = make_opt(model)
    x, y = data()
    for _ in range(STEPS):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def distributed(rank, size, make_opt=sgd, passes=1, clip=None, loss_scale=1.0,
                model_kwargs=None, data=batch, model_cls=Net, check_pending=True, groups_of=None,
                device=None, **dist_kwargs):
    """device: where the model and this rank's data live (tests/rank_scripts/gpu_torch_training.py
    passes a GPU); the weights come back from there."""
    model = make_model(model_cls, **(model_kwargs or {})).to(device)
    base = make_opt(model)
    if groups_of is not None:
        dist_kwargs["groups"] = groups_of(model)
    opt = DistributedOptimizer(base, named_parameters=model.named_parameters(),
                               backward_passes_per_step=passes, **dist_kwargs)
    assert isinstance(opt, type(base)), "the wrapper is not an instance of %s" % type(base)
    x, y = (t.to(device) for t in data())
    rows = BATCH // size
    x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
    micro = rows // passes
    for step in range(STEPS):
        opt.zero_grad()
        for k in range(passes):
            xs, ys = x[k * micro:(k + 1) * micro], y[k * micro:(k + 1) * micro]
            (loss_fn(model(xs), ys) * loss_scale / passes).backward()
            if check_pending and step == 0 and size > 1:
                # The hooks started every reduction during backward() (on the last
                # pass), or gathered it to start with others while the core holds.
                gathered = {id(p) for p in opt._gathered}
                buckets = opt._buckets
                in_buckets = set() if buckets is None else {  # slots final this step
                    key for b in buckets.buckets for key in b.ready}
                pending = [entry[1] not in (None, _IN_BUCKET) or key in gathered
                           or key in in_buckets for key, entry in opt._handles.items()]
                used = [p for p in model.parameters() if p.grad is not None]
                if k == passes - 1:
                    assert len(pending) == len(used) and all(pending), \
                        "after backward %d of %d: %d of %d reductions started" % (
                            k + 1, passes, sum(pending), len(used))
                    # Gradients outside groups and buckets (gradient views) are
                    # gathered exactly while the core holds their device's requests
                    # (these models are far below its default bytes, CPU and GPU).
                    def holds(p):
                        return opt._process_set.hold(gpu=not p.is_cpu)[0] > 0
                    expect = [p for p in used if holds(p)
                              and id(p) not in opt._group_of
                              and not (buckets and buckets.covers(p) and not buckets.left(p))]
                    assert sorted(map(id, expect)) == sorted(gathered), \
                        "%d gradients gathered, expected %d (hold %s)" % (
                            len(gathered), len(expect), opt._process_set.hold())
                else:
                    assert not any(pending), "a reduction started before the last pass"
        if clip is not None:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    return [p.detach().clone() for p in model.parameters()]


def compare(got, expected, tol, what, must_differ=False):
    worst = max(float((g - e).abs().max()) for g, e in zip(got, expected))
    scale = max(float(e.abs().max()) for e in expected)
    assert worst <= tol * max(1.0, scale), \
        "%s: weights differ from single-process training by %.3g (tolerance %.3g)" % (
            what, worst, tol)
    if must_differ:
        assert worst > 1e-12, "%s: result is exact, so the compression was not applied" % what
    return worst


def same_on_every_rank(weights, what):
    flat = torch.cat([w.flatten() for w in weights])
    everyone = hvd.allgather(flat.unsqueeze(0), name="same." + what)
    for r in range(everyone.shape[0]):
        assert torch.equal(everyone[r], flat) or torch.equal(everyone[r], everyone[0]), \
            "%s: rank %d's weights differ from this rank's" % (what, r)
        assert torch.equal(everyone[r], everyone[0]), \
            "%s: rank %d's weights differ from rank 0's" % (what, r)


def body():
    rank, size = init()
    ref_sgd = reference()

    cases = [
        ("average", {}, ref_sgd, TOL),
        ("passes2", {"passes": 2}, ref_sgd, TOL),
        # Explicit groups: fc1.weight with fc2.weight, fc1.bias alone; fc2.bias ungrouped.
        ("groups", {"groups_of": lambda m: [[m.fc1.weight, m.fc2.weight], [m.fc1.bias]]},
         ref_sgd, TOL),
        ("num_groups", {"num_groups": 2}, ref_sgd, TOL),
        ("predivide", {"gradient_predivide_factor": 2.0}, ref_sgd, TOL),
        ("sum", {"op": hvd.Sum, "loss_scale": 1.0 / size}, ref_sgd, TOL),
        ("passes2_groups", {"passes": 2, "num_groups": 3}, ref_sgd, TOL),
        ("adam", {"make_opt": adam}, reference(adam), TOL),
        ("clip_skip_synchronize", {"clip": 0.05}, reference(clip=0.05), TOL),
        ("unused_param", {"model_kwargs": {"unused": True}},
         reference(model_kwargs={"unused": True}), TOL),
        ("sparse_as_dense", {"model_cls": EmbedNet, "model_kwargs": {"sparse": True},
                             "data": embed_batch, "sparse_as_dense": True},
         reference(model_cls=EmbedNet, model_kwargs={"sparse": False}, data=embed_batch), TOL),
        ("sparse", {"model_cls": EmbedNet, "model_kwargs": {"sparse": True}, "data": embed_batch},
         reference(model_cls=EmbedNet, model_kwargs={"sparse": True}, data=embed_batch), TOL),
        ("sparse_passes2", {"model_cls": EmbedNet, "model_kwargs": {"sparse": True},
                            "data": embed_batch, "passes": 2},
         reference(model_cls=EmbedNet, model_kwargs={"sparse": True}, data=embed_batch), TOL),
    ]
    # sparse_as_dense reduces dense and gives the optimizer the gradient's own layout
    # back: SparseAdam would refuse a dense one. (fc is outside the optimizer, so its
    # reductions never start: no pending check.)
    embed_sparse = {"model_cls": EmbedNet, "model_kwargs": {"sparse": True}, "data": embed_batch,
                    "make_opt": sparse_adam, "check_pending": False}
    ref_sparse_adam = reference(sparse_adam, model_cls=EmbedNet, model_kwargs={"sparse": True},
                                data=embed_batch)
    cases += [("sparse_adam", embed_sparse, ref_sparse_adam, TOL),
              ("sparse_adam_as_dense", dict(embed_sparse, sparse_as_dense=True), ref_sparse_adam, TOL),
              ("sparse_adam_as_dense_passes2", dict(embed_sparse, sparse_as_dense=True, passes=2),
               ref_sparse_adam, TOL)]
    for what, kwargs, expected, tol in cases:
        got = distributed(rank, size, **kwargs)
        worst = compare(got, expected, tol, what)
        same_on_every_rank(got, what)
        if rank == 0:
            log("%s: max |diff| %.3g" % (what, worst))

    # Compressed wire formats: close to the exact result, but not equal to it.
    for what, compression, tol in (("fp16", Compression.fp16, 2e-3), ("bf16", Compression.bf16, 2e-2)):
        got = distributed(rank, size, compression=compression)
        worst = compare(got, ref_sgd, tol, what, must_differ=True)
        same_on_every_rank(got, what)
        if rank == 0:
            log("%s: max |diff| %.3g" % (what, worst))

    errors(rank, size)


def errors(rank, size):
    model = make_model()
    named = list(model.named_parameters())

    dup = [("w", named[0][1]), ("w", named[1][1])] + named[2:]
    expect_raises(ValueError, "duplicate names", DistributedOptimizer, sgd(model),
                  named_parameters=dup, contains=("w",))
    missing = named[:-1]
    expect_raises(ValueError, "missing names", DistributedOptimizer, sgd(model),
                  named_parameters=missing, contains=("were not named", "(3,)"))
    expect_raises(ValueError, "predivide with Adasum", DistributedOptimizer, sgd(model),
                  op=hvd.Adasum, gradient_predivide_factor=2.0)
    expect_raises(ValueError, "predivide with Sum", DistributedOptimizer, sgd(model),
                  op=hvd.Sum, gradient_predivide_factor=2.0)

    # zero_grad() while the reductions started by backward() are pending.
    x, y = batch()
    opt = DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    loss_fn(model(x), y).backward()
    if size > 1:
        expect_raises(AssertionError, "zero_grad while pending", opt.zero_grad,
                      contains=("zero_grad", "step()"))
    opt.step()
    opt.zero_grad()  # fine once step() has waited

    # More backward passes than backward_passes_per_step before step().
    loss_fn(model(x), y).backward()
    if size > 1:
        expect_raises(AssertionError, "too many passes", lambda: loss_fn(model(x), y).backward(),
                      contains=("backward_passes_per_step",))
    opt.step()

    # The error again, and the optimizer dropped with its step unfinished: a new one over
    # a new model of the same names (the same request names) trains at once, as in
    # Horovod, whose background thread completes the dropped step's reductions without
    # a waiter. (The old model keeps the old optimizer's hooks, in Horovod too.)
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    if size > 1:
        expect_raises(AssertionError, "too many passes, dropped",
                      lambda: loss_fn(model(x), y).backward())
    del opt
    model = make_model()
    ref = copy.deepcopy(model)
    opt = DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                               op=hvd.Sum)
    assert (opt.op, opt.gradient_predivide_factor, opt.sparse_as_dense, opt.process_set) == \
        (hvd.Sum, 1.0, False, hvd.global_process_set), "Horovod's optimizer attributes"
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.synchronize()
    for p, q in zip(model.parameters(), ref.parameters()):
        q.grad = None
    loss_fn(ref(x), y).backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad * size, rtol=1e-5, atol=1e-6), \
            "new optimizer after the error: %s" % n
    with opt.skip_synchronize():
        opt.step()

    # step() right after synchronize() (outside skip_synchronize) warns.
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    assert any("skip_synchronize" in str(w.message) for w in caught), \
        "no warning for step() after synchronize(): %s" % [str(w.message) for w in caught]

    # A sparse gradient in a group (grouped reductions are dense) without
    # sparse_as_dense: a clear error from backward().
    if size > 1:
        emodel = make_model(EmbedNet, sparse=True)
        eopt = DistributedOptimizer(sgd(emodel), named_parameters=emodel.named_parameters(),
                                    groups=[[emodel.emb.weight, emodel.fc.weight]])
        idx, ey = embed_batch()
        expect_raises(NotImplementedError, "sparse gradient", lambda: loss_fn(emodel(idx), ey).backward(),
                      contains=("sparse_as_dense", "emb.weight"))
        for h in eopt._hook_handles:
            h.remove()
        eopt._handles.clear()


if __name__ == "__main__":
    main(body)
