"""DistributedOptimizer's requests are packed once and only the gradient's address is
refreshed every step (adapter.submit's packed requests); what would make a stale
request wrong must pack it anew. Each case trains the same
float64 model distributed (this rank's slice of the batch) and in plain torch (the
whole batch) and compares the weights after every phase:
- zero_grad(set_to_none=False): the same gradient storage every step;
- zero_grad(set_to_none=True): a new gradient storage every step;
- a parameter stored transposed (its gradient is not contiguous: general path);
- the model moved to float32 mid-training (new dtype: rebuilt);
- a parameter reshaped mid-training, (3,) -> (1, 3) (new shape: rebuilt);
- fp16 compression (a new wire tensor every step), backward_passes_per_step=2.
The phases run with gradients as bucket views (grad_buckets.py) and without.
Then an in-flight gradient given other memory with `.data =` raises the adapter's
clear error at synchronize() (the gradient is held, so its old memory is still
valid while the core writes into it), on every rank.
"""
import torch
import torch.nn as nn

from common import expect_raises, hvd, init, main

from perseus.torch.compression import Compression
from perseus.torch.optimizer import DistributedOptimizer

BATCH = 24
STEPS = 4  # per phase


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.w1 = nn.Parameter(torch.randn(5, 8, generator=g, dtype=torch.float64))
        # Stored transposed: its gradient has the same (non-contiguous) strides.
        self.w2 = nn.Parameter(torch.randn(3, 8, generator=g, dtype=torch.float64).t())
        self.b = nn.Parameter(torch.randn(3, generator=g, dtype=torch.float64))

    def forward(self, x):
        return torch.tanh(x @ self.w1) @ self.w2 + self.b


def data(dtype):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(BATCH, 5, generator=g, dtype=torch.float64)
    y = torch.randn(BATCH, 3, generator=g, dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def to_float32(model):
    for p in model.parameters():
        p.data = p.data.float()


def reshape_bias(model):
    model.b.grad = None  # of the old shape
    model.b.data = model.b.data.view(1, 3)


PHASES = [  # (what, set_to_none, change applied before the phase, dtype)
    ("zeroed grads", False, None, torch.float64),
    ("grads set to None", True, None, torch.float64),
    ("float32", True, to_float32, torch.float32),
    ("reshaped bias", False, reshape_bias, torch.float32),
]


def train(model, opt, x, y, set_to_none, passes=1):
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=set_to_none)
        micro = x.shape[0] // passes
        for k in range(passes):
            xs, ys = x[k * micro:(k + 1) * micro], y[k * micro:(k + 1) * micro]
            (((model(xs) - ys) ** 2).mean() / passes).backward()
        opt.step()


def compare(model, ref, tol, what):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.shape == q.shape and p.dtype == q.dtype, (what, name, p.shape, q.shape)
        worst = float((p - q).abs().max())
        assert worst <= tol, "%s: %s differs from plain torch by %.3g" % (what, name, worst)


def phases(rank, size, views):
    model, ref = Net(), Net()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(),
                               gradient_as_bucket_view=views)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    rows = BATCH // size
    assert not model.w2.is_contiguous()
    for what, set_to_none, change, dtype in PHASES:
        if change is not None:
            change(model)
            change(ref)
        x, y = data(dtype)
        train(model, opt, x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows],
              set_to_none)
        train(ref, ref_opt, x, y, set_to_none)
        compare(model, ref, 1e-12 if dtype == torch.float64 else 1e-5,
                "%s (gradient views %s)" % (what, views))


def compressed(rank, size):
    model, ref = Net(), Net()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(),
                               compression=Compression.fp16, backward_passes_per_step=2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = data(torch.float64)
    rows = BATCH // size
    train(model, opt, x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows],
          True, passes=2)
    train(ref, ref_opt, x, y, True)
    compare(model, ref, 5e-3, "fp16 compression, backward_passes_per_step=2")


def moved_in_flight(rank, size):
    model = Net()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(),
                               gradient_as_bucket_view=False)  # the gathering path
    x, y = data(torch.float64)
    # Gathered by the hooks, not yet enqueued (the core holds CPU requests by
    # default): a gradient moved now is reduced where it is at synchronize().
    ((model(x) - y) ** 2).mean().backward()
    assert any(p is model.w1 for p in opt._gathered), "w1's gradient was not gathered"
    model.w1.grad.data = torch.full((5, 8), float(rank), dtype=torch.float64)
    opt.synchronize()
    expected = torch.full((5, 8), (size - 1) / 2, dtype=torch.float64)
    assert torch.equal(model.w1.grad, expected), "moved while gathered: %s" % model.w1.grad
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    # Enqueued (as the hooks do once the hold's bytes are gathered), then moved: the
    # result would go to the former memory, so synchronize() says so.
    ((model(x) - y) ** 2).mean().backward()
    opt._submit_gathered()
    model.w1.grad.data = torch.zeros(5, 8, dtype=torch.float64)  # out of contract
    expect_raises(ValueError, "gradient moved in flight", opt.synchronize,
                  contains=["while the request was in flight"])
    opt.zero_grad()
    train(model, opt, x, y, True)  # the optimizer still works


def body():
    rank, size = init()
    for views in (False, True):
        phases(rank, size, views)
    compressed(rank, size)
    moved_in_flight(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
