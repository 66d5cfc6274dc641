"""DistributedDataParallel: training on per-rank slices equals single-process training
on the whole batch (float64, 1e-9), join() with uneven inputs, groups, pickling, and
the error cases.

Every rank computes the single-process reference itself with plain torch. Variants:
defaults, one bucket per parameter, gradient_as_bucket_view, no_sync accumulation,
complex parameters and buffers (with the view, the allreduce hook and the fp16 hook),
find_unused_parameters and static_graph with an unused parameter, Adam, Perseus's
allreduce hook (exact) and bf16 hook (close, not exact). join(): rank r has
STEPS - r batches; the reference sums the active ranks' gradients per step and
divides by the world size (or, with divide_by_initial_world_size=False, by the
active ranks); afterwards every rank holds the last joiner's parameters and
buffers. Errors, each raised on every rank without a hang: a parameter without
gradient (named), one missing on one rank only, modules that differ across ranks,
bad constructor arguments.
"""
import io
import time

import torch
import torch.nn as nn

from common import expect_raises, launcher_rank_size, log, main

import perseus
import perseus.torch.distributed as dist
from perseus.torch.nn.parallel import comm_hooks

DDP = perseus.torch.nn.parallel.DistributedDataParallel
STEPS = 6
BATCH = 24  # divisible by 2 and 4 ranks, and by 2 micro-batches per rank
TOL = 1e-9


class Net(nn.Module):
    def __init__(self, unused=False, hidden=8):
        super().__init__()
        self.fc1 = nn.Linear(5, hidden)
        self.fc2 = nn.Linear(hidden, 3)
        if unused:
            self.spare = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class BNNet(Net):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x):
        return self.fc2(torch.tanh(self.bn(self.fc1(x))))


class ComplexNet(nn.Module):
    """Complex parameters and a complex buffer, as torch's DDP takes them."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 8, dtype=torch.complex128)
        self.fc2 = nn.Linear(8, 3, dtype=torch.complex128)
        self.register_buffer("phase", torch.polar(torch.ones(8, dtype=torch.float64),
                                                  torch.rand(8, dtype=torch.float64)))

    def forward(self, x):
        z = self.fc1(torch.complex(x, x.flip(-1)))
        return self.fc2(torch.tanh(z) * self.phase).abs()


def make_model(cls=Net, seed=1234, **kwargs):
    torch.manual_seed(seed)
    return cls(**kwargs).double()


def batch(step=0):
    g = torch.Generator().manual_seed(99 + step)
    return (torch.randn(BATCH, 5, generator=g, dtype=torch.float64),
            torch.randn(BATCH, 3, generator=g, dtype=torch.float64))


def loss_fn(out, y):
    return ((out - y) ** 2).mean()


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=0.01)


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def reference(make_opt=sgd, **model_kwargs):
    model = make_model(**model_kwargs)
    opt = make_opt(model)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return weights(model)


def train(rank, size, make_opt=sgd, micro=1, hook=None, model_kwargs=None, device=None,
          **ddp_kwargs):
    """device: a GPU for torch's single-device form, DDP(model.cuda(), device_ids=[i])
    (tests/rank_scripts/gpu_torch_training.py); the weights come back from there."""
    # A different seed per rank: DDP's construction broadcast makes them equal.
    module = make_model(seed=1234 + rank, **(model_kwargs or {}))
    if device is not None and device.type == "cuda":
        module, ddp_kwargs = module.to(device), dict(ddp_kwargs, device_ids=[device.index])
    model = DDP(module, **ddp_kwargs)
    if hook is not None:
        model.register_comm_hook(None, hook)
    opt = make_opt(model)
    rows = BATCH // size
    for step in range(STEPS):
        x, y = (t.to(device) for t in batch(step))
        x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        part = rows // micro
        opt.zero_grad()
        for k in range(micro):
            xs, ys = x[k * part:(k + 1) * part], y[k * part:(k + 1) * part]
            if k < micro - 1:
                with model.no_sync():
                    (loss_fn(model(xs), ys) / micro).backward()
            else:
                (loss_fn(model(xs), ys) / micro).backward()
        opt.step()
    return weights(model.module)


def compare(got, expected, tol, what, must_differ=False):
    worst = max(float((g - e).abs().max()) for g, e in zip(got, expected))
    assert worst <= tol, "%s: weights differ from single-process training by %.3g" % (what, worst)
    if must_differ:
        assert worst > 1e-12, "%s: exact result, so the compression was not applied" % what
    return worst


def same_on_every_rank(tensors, what):
    flat = torch.cat([t.detach().flatten().double() for t in tensors])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    for r, theirs in enumerate(everyone):
        assert torch.equal(theirs, everyone[0]), "%s: rank %d differs from rank 0" % (what, r)


def training(rank, size):
    ref = reference()
    cases = [
        ("defaults", {}, ref, TOL),
        ("one_bucket_per_param", {"bucket_cap_mb": 1e-6}, ref, TOL),
        ("gradient_as_bucket_view", {"gradient_as_bucket_view": True}, ref, TOL),
        ("no_sync", {"micro": 2}, ref, TOL),
        ("no_sync_bucket_view", {"micro": 2, "gradient_as_bucket_view": True}, ref, TOL),
        ("adam", {"make_opt": adam}, reference(adam), TOL),
        ("find_unused", {"model_kwargs": {"unused": True}, "find_unused_parameters": True},
         reference(unused=True), TOL),
        ("static_graph", {"model_kwargs": {"unused": True}, "static_graph": True},
         reference(unused=True), TOL),
        ("allreduce_hook", {"hook": comm_hooks.allreduce_hook}, ref, TOL),
    ]
    complex_ref = reference(cls=ComplexNet)
    complex_model = {"cls": ComplexNet}
    cases += [
        ("complex", {"model_kwargs": complex_model}, complex_ref, TOL),
        ("complex_bucket_view", {"model_kwargs": complex_model, "gradient_as_bucket_view": True},
         complex_ref, TOL),
        ("complex_allreduce_hook", {"model_kwargs": complex_model,
                                    "hook": comm_hooks.allreduce_hook}, complex_ref, TOL),
    ]
    for what, kwargs, expected, tol in cases:
        got = train(rank, size, **kwargs)
        worst = compare(got, expected, tol, what)
        same_on_every_rank(got, what)
        if rank == 0:
            log("%s: max |diff| %.3g" % (what, worst))
    got = train(rank, size, hook=comm_hooks.bf16_compress_hook)
    compare(got, ref, 2e-2, "bf16_hook", must_differ=True)
    same_on_every_rank(got, "bf16_hook")
    # Both parts go through the half-precision wire: its rounding (5e-4 of a gradient)
    # grows with this model's large gradients to about 1e-2 of weights up to 29 in six
    # steps; a part left out would be off by the weights' size.
    got = train(rank, size, model_kwargs=complex_model, hook=comm_hooks.fp16_compress_hook)
    compare(got, complex_ref, 5e-2, "complex_fp16_hook", must_differ=True)
    same_on_every_rank(got, "complex_fp16_hook")


# ---- join ----------------------------------------------------------------------

def join_reference(size, steps_of, divide_by_initial):
    model = make_model()
    opt = sgd(model)
    rows = BATCH // size
    for step in range(max(steps_of)):
        x, y = batch(step)
        active = [r for r in range(size) if steps_of[r] > step]
        opt.zero_grad()
        loss = sum(loss_fn(model(x[r * rows:(r + 1) * rows]), y[r * rows:(r + 1) * rows])
                   for r in active)
        (loss / (size if divide_by_initial else len(active))).backward()
        opt.step()
    return weights(model)


def join_training(rank, size, steps_of, divide_by_initial):
    model = DDP(make_model(seed=1234 + rank))
    opt = sgd(model)
    rows = BATCH // size
    with model.join(divide_by_initial_world_size=divide_by_initial):
        for step in range(steps_of[rank]):
            x, y = batch(step)
            opt.zero_grad()
            loss_fn(model(x[rank * rows:(rank + 1) * rows]), y[rank * rows:(rank + 1) * rows]) \
                .backward()
            opt.step()
    return weights(model.module)


def join_tests(rank, size):
    for steps_of in ([STEPS - r for r in range(size)], [2 + r for r in range(size)]):
        for divide in (True, False):
            what = "join steps %s divide_by_initial=%s" % (steps_of, divide)
            got = join_training(rank, size, steps_of, divide)
            compare(got, join_reference(size, steps_of, divide), TOL, what)
            same_on_every_rank(got, what)

    # Buffers: BatchNorm statistics end up as the last joiner's on every rank.
    model = DDP(make_model(BNNet, seed=1234 + rank))
    with model.join():
        for step in range(1 + rank):
            x, _ = batch(step)
            model(x[rank * 2:rank * 2 + 2]).sum().backward()
    same_on_every_rank(list(model.module.buffers()) + list(model.module.parameters()),
                       "join buffers")

    # throw_on_early_termination: once rank 0 runs out, every rank raises.
    model = DDP(make_model(seed=1234 + rank))

    def uneven():
        with model.join(throw_on_early_termination=True):
            for step in range(2 + 3 * rank):
                x, y = batch(step)
                loss_fn(model(x[:4]), y[:4]).backward()

    expect_raises(RuntimeError, "throw_on_early_termination", uneven,
                  contains=("exhausted inputs",))
    if rank == 0:
        log("join: ok")


# ---- groups, pickling, modes ---------------------------------------------------------

def group_test(rank, size):
    members = [0, 1]
    group = dist.new_group(members)
    if rank not in members:
        return
    model = DDP(make_model(seed=1234 + rank), process_group=group)
    x, y = batch()
    loss_fn(model(x[rank * 4:rank * 4 + 4]), y[rank * 4:rank * 4 + 4]).backward()
    plain = make_model()  # rank 0's initial weights
    grads = []
    for r in members:
        plain.zero_grad()
        loss_fn(plain(x[r * 4:r * 4 + 4]), y[r * 4:r * 4 + 4]).backward()
        grads.append([p.grad.clone() for p in plain.parameters()])
    for i, p in enumerate(model.module.parameters()):
        expected = sum(g[i] for g in grads) / len(members)
        assert (p.grad - expected).abs().max() <= TOL, "group DDP: gradient %d wrong" % i


def module_behaviour(rank, size):
    model = DDP(make_model(BNNet, seed=1234 + rank))
    keys = list(model.state_dict())
    assert keys and all(k.startswith("module.") for k in keys), keys
    model.eval()
    assert not model.module.training and not model.module.bn.training
    model.train()
    assert model.module.training and model.module.bn.training
    # Pickling: the copy is a working DDP on the same weights.
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    copy = torch.load(buffer, weights_only=False)
    assert isinstance(copy, DDP)
    for a, b in zip(copy.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    x, y = batch()
    for m in (model, copy):
        loss_fn(m(x[:4]), y[:4]).backward()
    for a, b in zip(copy.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad), "the unpickled DDP reduces differently"
    # Forward without grad does not arm the reduction; the next one skips the buffer sync.
    with torch.no_grad():
        model(x[:4])
    assert not model.require_forward_param_sync


# ---- errors ------------------------------------------------------------------------

class Partly(nn.Module):
    """`extra` gets no gradient on rank 1."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 3)
        self.extra = nn.Linear(5, 3)

    def forward(self, x):
        out = self.fc(x)
        return out if RANK == 1 else out + self.extra(x)


def errors(rank, size):
    x, y = batch()

    model = DDP(make_model(unused=True))

    def backward():
        loss_fn(model(x[:4]), y[:4]).backward()

    for attempt in range(2):  # the reducer recovers: the same error again, no hang
        start = time.monotonic()
        expect_raises(RuntimeError, "unused parameter", backward, within_s=30,
                      contains=("'spare'", "find_unused_parameters=True"))
        log("unused parameter: raised in %.2f s" % (time.monotonic() - start))

    model = DDP(make_model(unused=True))  # through a communication hook
    model.register_comm_hook(None, comm_hooks.fp16_compress_hook)
    expect_raises(RuntimeError, "unused parameter with a hook", backward, within_s=30,
                  contains=("'spare'",))

    model = DDP(Partly().double())
    want = ("'extra.weight'",) if rank == 1 else ("find_unused_parameters=True",)
    expect_raises(RuntimeError, "parameter missing on rank 1 only", backward, within_s=30,
                  contains=want)

    def mismatched():
        DDP(make_model(hidden=8 if rank != size - 1 else 9))
    expect_raises(RuntimeError, "modules differ", mismatched, contains=("fc1.weight",))

    expect_raises(ValueError, "device_ids on CPU", DDP, make_model(), device_ids=[0],
                  contains=("device_ids",))
    expect_raises(ValueError, "foreign group", DDP, make_model(), process_group=object(),
                  contains=("group must be",))
    frozen = make_model()
    for p in frozen.parameters():
        p.requires_grad_(False)
    expect_raises(RuntimeError, "no trainable parameter", DDP, frozen,
                  contains=("doesn't have any parameter",))
    expect_raises(NotImplementedError, "sparse gradients", DDP, nn.Embedding(4, 2, sparse=True),
                  contains=("sparse",))
    expect_raises(NotImplementedError, "mixed_precision", DDP, make_model(),
                  mixed_precision=object(), contains=("mixed_precision",))
    model = DDP(make_model())
    model.register_comm_hook(None, comm_hooks.fp16_compress_hook)
    expect_raises(RuntimeError, "second comm hook", model.register_comm_hook, None,
                  comm_hooks.allreduce_hook, contains=("once",))
    # Everything still works afterwards (no request left in flight under a reused name).
    ref = reference()
    compare(train(rank, size), ref, TOL, "after errors")
    if rank == 0:
        log("errors: ok")


def body():
    global RANK
    RANK, size = launcher_rank_size()
    dist.init_process_group()
    training(RANK, size)
    join_tests(RANK, size)
    group_test(RANK, size)
    module_behaviour(RANK, size)
    errors(RANK, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(body)
