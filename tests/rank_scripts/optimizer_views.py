"""DistributedOptimizer with gradients as bucket views (perseus/torch/grad_buckets.py)
against the same training without them (one request per gradient), and against plain
torch on the whole batch:

- the weights are bit-identical with and without views, for float32, float64 and
  bfloat16, backward_passes_per_step 1 and 2, zero_grad(set_to_none=True / False),
  a group beside the buckets, fp16 compression (views are off under it), a parameter without a gradient,
  a sparse nn.Embedding (it leaves the buckets) and sparse_as_dense; at four ranks
  the model is integer-valued so that every sum is exact in any order;
- with zero_grad(set_to_none=False), from the second step every gradient IS its
  bucket view and only the buckets' requests are made (nothing packed or unpacked);
  with set_to_none=True each fresh gradient is copied in and .grad bound again;
- a gradient replaced by the script after backward() still gets the reduced value.
"""
import torch
import torch.nn as nn

from common import hvd, init, main

from perseus.torch import adapter
from perseus.torch.compression import Compression
from perseus.torch.optimizer import DistributedOptimizer

BATCH = 16
STEPS = 3


class Net(nn.Module):
    """Real-valued, with a parameter that never gets a gradient and an embedding."""

    def __init__(self, dtype, sparse=False, integer=False):
        super().__init__()
        g = torch.Generator().manual_seed(5)

        def weight(*shape):
            w = torch.randint(-2, 3, shape, generator=g) if integer else torch.randn(*shape, generator=g)
            return nn.Parameter(w.to(dtype))

        self.embed = nn.Embedding(10, 4, sparse=sparse).to(dtype)
        with torch.no_grad():
            self.embed.weight.copy_(weight(10, 4))
        self.w1 = weight(4, 6)
        self.w2 = weight(6, 3)
        self.unused = weight(2, 2)
        self.integer = integer

    def forward(self, idx):
        h = self.embed(idx) @ self.w1
        return (h if self.integer else torch.tanh(h)) @ self.w2


def batch(dtype, rank, size):
    g = torch.Generator().manual_seed(9)
    idx = torch.randint(0, 10, (BATCH,), generator=g)
    y = torch.randint(-3, 4, (BATCH, 3), generator=g).to(dtype)
    rows = BATCH // size
    return idx[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows], idx, y


def loss_of(out, y, integer):
    # Integer-valued: a sum, so every gradient is an integer (exact in any order).
    return (out * y).sum() if integer else ((out - y) ** 2).mean()


def train(views, dtype, size, rank, passes=1, set_to_none=True, sparse=False, integer=False,
          requests=None, **kwargs):
    model = Net(dtype, sparse, integer)
    if kwargs.get("groups") == "w":  # a group of two; the others reduced one by one
        kwargs["groups"] = [[model.w1, model.w2]]
    lr = 0.125 if integer else 0.1
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr), named_parameters=model.named_parameters(),
                               backward_passes_per_step=passes, gradient_as_bucket_view=views,
                               **kwargs)
    idx, y, _, _ = batch(dtype, rank, size)
    micro = idx.shape[0] // passes
    for step in range(STEPS):
        opt.zero_grad(set_to_none=set_to_none)
        for k in range(passes):
            part = slice(k * micro, (k + 1) * micro)
            (loss_of(model(idx[part]), y[part], integer) / passes).backward()
        if requests is not None:
            requests.append([])
        opt.step()
    return model, opt


def same_weights(a, b, what):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        if not torch.equal(p, q):
            raise AssertionError("%s: %s differs with gradient views (max %.3g)"
                                 % (what, name, float((p.double() - q.double()).abs().max())))


def identical(rank, size):
    integer = size > 2  # sums of more than two floats depend on their order
    cases = [dict(dtype=torch.float32), dict(dtype=torch.float64), dict(dtype=torch.bfloat16),
             dict(dtype=torch.float32, passes=2), dict(dtype=torch.float32, set_to_none=False),
             dict(dtype=torch.float64, passes=2, set_to_none=False),
             dict(dtype=torch.float32, groups="w"),
             dict(dtype=torch.float32, compression=Compression.fp16),
             dict(dtype=torch.float32, sparse=True),
             dict(dtype=torch.float32, sparse=True, sparse_as_dense=True)]
    for case in cases:
        case = dict(case, integer=integer)
        with_views, opt = train(True, size=size, rank=rank, **case)
        without, _ = train(False, size=size, rank=rank, **case)
        same_weights(with_views, without, "case %s" % case)
        on = opt._buckets is not None
        assert on == ("compression" not in case), "gradient views on: %s, case %s" % (on, case)
        if case.get("sparse") and not case.get("sparse_as_dense"):
            assert opt._buckets.left(with_views.embed.weight), "the sparse gradient stayed in a bucket"


def against_plain_torch(rank, size):
    model, _ = train(True, torch.float64, size, rank)
    ref = Net(torch.float64)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    _, _, idx, y = batch(torch.float64, rank, size)
    for _ in range(STEPS):
        opt.zero_grad()
        loss_of(ref(idx), y, False).backward()
        for p in ref.parameters():  # DistributedOptimizer gives a missing gradient zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        worst = float((p - q).abs().max())
        assert worst <= 1e-12, "%s differs from plain torch on the whole batch by %.3g" % (name, worst)


def no_copies(rank, size):
    """set_to_none=False: the gradients stay bucket views; only buckets are reduced."""
    calls = []
    real = adapter.submit

    def counted(op_type, tensors, *args, **kwargs):
        calls[-1].extend(tensors)
        return real(op_type, tensors, *args, **kwargs)

    adapter.submit = counted
    try:
        model, opt = train(True, torch.float32, size, rank, set_to_none=False, requests=calls)
    finally:
        adapter.submit = real
    buckets = opt._buckets.buckets
    flats = [(b.flat.data_ptr(), b.flat.data_ptr() + b.flat.numel() * b.flat.element_size())
             for b in buckets]
    for name, p in model.named_parameters():
        inside = any(lo <= p.grad.data_ptr() < hi for lo, hi in flats)
        assert inside, "%s: its gradient is not a bucket view after the steps" % name
    assert all(len(step) == len(buckets) for step in calls), \
        "requests per step %s, buckets %d" % ([len(s) for s in calls], len(buckets))


def replaced_gradient(rank, size):
    """A script that replaces .grad after backward() gets the reduced value in it."""
    model = Net(torch.float64)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
    idx, y, _, _ = batch(torch.float64, rank, size)
    loss_of(model(idx), y, False).backward()
    own = torch.full_like(model.w1, 123.0)
    model.w1.grad = own
    opt.synchronize()
    assert model.w1.grad is own, "the replaced gradient was not kept"
    ref = torch.zeros_like(model.w1)
    for r in range(size):
        m = Net(torch.float64)
        i, t, _, _ = batch(torch.float64, r, size)
        loss_of(m(i), t, False).backward()
        ref += m.w1.grad / size
    assert torch.allclose(own, ref, atol=1e-12, rtol=0), "the replaced gradient lacks the average"
    with opt.skip_synchronize():
        opt.step()


def body():
    rank, size = init()
    identical(rank, size)
    against_plain_torch(rank, size)
    no_copies(rank, size)
    replaced_gradient(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
