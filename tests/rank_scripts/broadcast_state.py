"""broadcast_parameters / broadcast_optimizer_state / broadcast_object / allgather_object.

Every rank starts from a different model (weights and BatchNorm buffers) and a
different optimizer (hyperparameters and state: some ranks have stepped, some not),
all pure functions of the rank. Each rank rebuilds root's setup locally with plain
torch (the expectation, computed without the library) and checks that after the
broadcasts its parameters, buffers, every optimizer state tensor and scalar (`step`
included) and every param_groups entry equal root's exactly, and again after one
more identical training step. Root is rank 0, then the last rank. Optimizers: SGD
with momentum, Adam, AdamW, RMSprop (momentum, centered), Adagrad, and one wrapped in
DistributedOptimizer.
"""
import torch
import torch.nn as nn

from common import init, main

from perseus.torch.functions import (allgather_object, broadcast_object,
                                     broadcast_optimizer_state, broadcast_parameters)
from perseus.torch.optimizer import DistributedOptimizer


def make_model(seed):
    torch.manual_seed(1000 + seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2))
    return model.double()


# name -> factory(params, rank): hyperparameters differ by rank.
OPTIMIZERS = {
    "sgd": lambda ps, r: torch.optim.SGD(ps, lr=0.1 + 0.01 * r, momentum=0.9 - 0.1 * r,
                                         weight_decay=1e-4 * r, nesterov=(r % 2 == 0)),
    "adam": lambda ps, r: torch.optim.Adam(ps, lr=0.01 * (r + 1), betas=(0.9 - 0.05 * r, 0.999),
                                           eps=1e-8 * (r + 1), amsgrad=(r % 2 == 1)),
    "adamw": lambda ps, r: torch.optim.AdamW(ps, lr=0.02 + 0.001 * r, weight_decay=0.01 * (r + 1)),
    "rmsprop": lambda ps, r: torch.optim.RMSprop(ps, lr=0.01 * (r + 1), alpha=0.9 + 0.01 * r,
                                                 momentum=0.5, centered=(r % 2 == 0)),
    "adagrad": lambda ps, r: torch.optim.Adagrad(ps, lr=0.05 * (r + 1), lr_decay=0.001 * r,
                                                 initial_accumulator_value=0.1 * r),
}


def data(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(8, 4, generator=g, dtype=torch.float64),
            torch.randn(8, 2, generator=g, dtype=torch.float64))


def train_step(model, opt, seed):
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in data(seed))
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.step()


def setup(name, rank, steps, wrap=False, device=None):
    """The model and optimizer `rank` starts with, after `steps` local steps, on
    `device` (None: the CPU)."""
    model = make_model(rank).to(device)
    # Two param groups, the second with its own lr, so group-wise entries matter.
    params = list(model.parameters())
    opt = OPTIMIZERS[name]([{"params": params[:2]}, {"params": params[2:], "lr": 0.003 * (rank + 1)}],
                           rank)
    for i in range(steps):
        train_step(model, opt, 50 + 10 * rank + i)
    if wrap:
        opt = DistributedOptimizer(opt, named_parameters=model.named_parameters())
    return model, opt


def initialise_like_horovod(model, opt):
    """What broadcast_optimizer_state does first to an optimizer without state (as
    Horovod): zero gradients, one step; the parameters then put back (Perseus)."""
    saved = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    with torch.no_grad():
        for p, value in zip(model.parameters(), saved):
            p.copy_(value)


def steps_of(rank, root):
    """Root has stepped (or not: `fresh`); the others have a rank-dependent history."""
    return rank % 3


def assert_same_value(got, expected, what):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), "%s: %r is not a tensor" % (what, type(got))
        assert got.dtype == expected.dtype and got.shape == expected.shape, \
            "%s: %s %s vs root's %s %s" % (what, got.dtype, tuple(got.shape), expected.dtype,
                                           tuple(expected.shape))
        assert got.device == expected.device, "%s: on %s, root's on %s" % (what, got.device, expected.device)
        assert torch.equal(got, expected), "%s: values differ from root's" % what
    else:
        assert type(got) is type(expected) and got == expected, \
            "%s: %r differs from root's %r" % (what, got, expected)


def assert_same_state(model, opt, ref_model, ref_opt, what):
    ref_sd = ref_model.state_dict()
    sd = model.state_dict()
    assert list(sd) == list(ref_sd), "%s: model state keys differ" % what
    for key in ref_sd:
        assert_same_value(sd[key], ref_sd[key], "%s: model %s" % (what, key))
    got, expected = opt.state_dict(), ref_opt.state_dict()
    assert sorted(got["state"]) == sorted(expected["state"]), \
        "%s: optimizer state held for params %s, root holds %s" % (
            what, sorted(got["state"]), sorted(expected["state"]))
    for index, entries in expected["state"].items():
        assert sorted(got["state"][index]) == sorted(entries), \
            "%s: state keys of param %d differ" % (what, index)
        for key, value in entries.items():
            assert_same_value(got["state"][index][key], value, "%s: state[%d][%s]" % (what, index, key))
    assert len(got["param_groups"]) == len(expected["param_groups"]), what
    for i, (g, e) in enumerate(zip(got["param_groups"], expected["param_groups"])):
        assert sorted(g) == sorted(e), "%s: param_groups[%d] keys differ" % (what, i)
        for key in e:
            assert g[key] == e[key], "%s: param_groups[%d][%r] = %r, root has %r" % (
                what, i, key, g[key], e[key])


def check_optimizer(name, rank, size, root, root_steps, wrap, device=None):
    """device: where every model lives, the reference's too (a GPU-trained root's state
    is reproduced by the same GPU steps, not by CPU ones)."""
    what = "%s root=%d root_steps=%d%s" % (name, root, root_steps, " wrapped" if wrap else "")
    mine = steps_of(rank, root) if rank != root else root_steps
    model, opt = setup(name, rank, mine, wrap, device)
    ref_model, ref_opt = setup(name, root, root_steps, device=device)
    if not ref_opt.state:  # (Adagrad has state from its constructor on)
        initialise_like_horovod(ref_model, ref_opt)

    if rank != root:
        # The test must be able to fail: this rank really starts out different.
        assert not torch.equal(model[0].weight, ref_model[0].weight), what

    if name == "sgd":
        broadcast_parameters(list(model.named_parameters()), root)
        broadcast_parameters(dict(model.named_buffers()), root)
    elif name == "adam":  # a generator of tensors, unnamed (Horovod takes lists only)
        broadcast_parameters(model.parameters(), root)
        broadcast_parameters(model.buffers(), root)
    else:
        broadcast_parameters(model.state_dict(), root)
    broadcast_optimizer_state(opt, root, model=model)
    assert_same_state(model, opt, ref_model, ref_opt, what + " (after broadcast)")

    # One more identical step (same data everywhere) keeps them identical.
    if wrap:
        # A plain local step of the wrapped optimizer: no hooks, no synchronize.
        for h in opt._hook_handles:
            h.remove()
        opt._hook_handles = []
        with opt.skip_synchronize():
            train_step(model, opt, 7)
    else:
        train_step(model, opt, 7)
    train_step(ref_model, ref_opt, 7)
    assert_same_state(model, opt, ref_model, ref_opt, what + " (after a step)")


def body():
    rank, size = init()
    for root in sorted({0, size - 1}):
        for name in OPTIMIZERS:
            for root_steps in (0, 2):
                check_optimizer(name, rank, size, root, root_steps, wrap=False)
        check_optimizer("adam", rank, size, root, 0, wrap=True)
        check_optimizer("sgd", rank, size, root, 1, wrap=True)

    # Objects.
    for root in range(size):
        obj = {"root": root, "payload": list(range(root * 100)), "t": torch.arange(root + 1)} \
            if rank == root else None
        got = broadcast_object(obj, root)
        assert got["root"] == root and got["payload"] == list(range(root * 100)), got
        assert torch.equal(got["t"], torch.arange(root + 1))
    got = broadcast_object("x" * (rank + 1) * 1000, root_rank=0, name="named")
    assert got == "x" * 1000, len(got)

    everyone = allgather_object({"rank": rank, "items": ["i"] * (rank * 7)})
    assert everyone == [{"rank": r, "items": ["i"] * (r * 7)} for r in range(size)], everyone
    everyone = allgather_object(rank if rank % 2 else str(rank), name="mixed")
    assert everyone == [r if r % 2 else str(r) for r in range(size)], everyone


if __name__ == "__main__":
    main(body)
