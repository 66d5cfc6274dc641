"""DistributedOptimizer gathers ungrouped CPU gradients and enqueues them together
exactly while the core would hold them (its PERSEUS_HOLD_BYTES / PERSEUS_HOLD_TIME,
read with ProcessSet.hold()). The test runs this script under several holds, in one
process.

The hooks' order is recorded by hooks registered before the optimizer's; the same
rule is replayed on it (gather; once the gathered bytes reach the hold, enqueue them
all), and after backward() the set still gathered and the set already started must
be the replay's. Then training on this rank's slice of the batch must equal plain
torch on the whole batch, under every hold.
"""
import torch
import torch.nn as nn

from common import check_engine_settings, init, main

from perseus.torch.optimizer import DistributedOptimizer

BATCH = 24
STEPS = 4


def make_model():
    torch.manual_seed(3)
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)]).double()


def data():
    g = torch.Generator().manual_seed(11)
    return (torch.randn(BATCH, 4, generator=g, dtype=torch.float64),
            torch.randn(BATCH, 4, generator=g, dtype=torch.float64))


def loss_of(model, x, y):
    return ((model(x) - y) ** 2).mean()


def replay(order, limit):
    """The gathered and the started parameters (ids) after hooks in `order`."""
    gathered, started, gathered_bytes = [], [], 0
    for p in order:
        if limit == 0:
            started.append(id(p))
            continue
        gathered.append(id(p))
        gathered_bytes += p.numel() * p.element_size()
        if gathered_bytes >= limit:
            started += gathered
            gathered, gathered_bytes = [], 0
    return sorted(gathered), sorted(started)


def body():
    rank, size = init()
    check_engine_settings()  # the test runs the holds in one process
    model, ref = make_model(), make_model()
    order = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(order.append)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(),
                               gradient_as_bucket_view=False)  # gathering is what is tested
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = data()
    rows = BATCH // size
    xs, ys = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
    limit, _ = opt._process_set.hold()
    for step in range(STEPS):
        opt.zero_grad()
        order.clear()
        loss_of(model, xs, ys).backward()
        assert len(order) == 8, order
        gathered = sorted(id(p) for p in opt._gathered)
        started = sorted(key for key, entry in opt._handles.items() if entry[1] is not None)
        want = replay(order, limit)
        assert (gathered, started) == want, \
            "hold %d bytes, step %d: gathered/started %d/%d, expected %d/%d" % (
                limit, step, len(gathered), len(started), len(want[0]), len(want[1]))
        opt.step()
        ref_opt.zero_grad()
        loss_of(ref, x, y).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        worst = float((p - q).abs().max())
        assert worst <= 1e-12, "hold %d: %s differs from plain torch by %.3g" % (limit, name, worst)


if __name__ == "__main__":
    main(body)
