"""DistributedDataParallel against torch's own DDP (gloo), in the same job.

Every rank builds one model with a rank-dependent seed (so the construction-time
broadcast from rank 0 matters), wraps one copy in perseus.torch.nn.parallel's DDP
and one in torch's DDP over gloo (MASTER_ADDR/MASTER_PORT from the test, ranks from
the launcher), feeds both the same per-rank batches, and requires after every
backward pass the same gradients (to 1e-6 of their scale; None where torch leaves
None), the same buffers, and after each optimizer step the same parameters.
Cases: BatchNorm buffers in float32 and float64, unused parameters (one no rank
uses, one only some ranks use) with find_unused_parameters, no_sync accumulation,
gradient_as_bucket_view (grads really are bucket views), one bucket per
parameter, static_graph (also with a parameter used in two reentrant checkpointed
passes), and the fp16 compression hook (torch's hook object,
registered on both).
"""
import contextlib
import copy
import os
import warnings

import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.checkpoint import checkpoint

from common import launcher_rank_size, log, main

import perseus
import perseus.torch.distributed as dist

PerseusDDP = perseus.torch.nn.parallel.DistributedDataParallel
STEPS = 3
TOL = 1e-6


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3)
        self.bn = nn.BatchNorm1d(4)
        self.fc1 = nn.Linear(24, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x, step):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc2(torch.relu(self.fc1(h.flatten(1))))


class UnusedNet(nn.Module):
    """`spare` is never used; `extra` only on some ranks at each step."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 8)
        self.extra = nn.Linear(8, 3)
        self.fc2 = nn.Linear(8, 3)
        self.spare = nn.Parameter(torch.ones(5))

    def forward(self, x, step):
        h = torch.tanh(self.fc1(x.flatten(1)))
        out = self.fc2(h)
        if (RANK + step) % 2 == 0:
            out = out + self.extra(h)
        return out


class StaticUnusedNet(UnusedNet):
    """`spare` never used, `extra` always used: the same graph every pass."""

    def forward(self, x, step):
        h = torch.tanh(self.fc1(x.flatten(1)))
        return self.fc2(h) + self.extra(h)


class CheckpointNet(BNNet):
    """fc1 runs in two reentrant checkpointed passes: its hooks fire twice per backward,
    which only static_graph supports."""

    def forward(self, x, step):
        h = torch.relu(self.bn(self.conv(x))).flatten(1)[:, :16]
        h = checkpoint(lambda t: torch.tanh(self.fc1(torch.cat([t, t[:, :8]], 1))), h,
                       use_reentrant=True)
        h = checkpoint(lambda t: torch.tanh(self.fc1(torch.cat([t, t[:, :8]], 1))), h,
                       use_reentrant=True)
        return self.fc2(h)


def batch(step, micro):
    g = torch.Generator().manual_seed(1000 * RANK + 10 * step + micro)
    return torch.randn(6, 2, 8, generator=g, dtype=torch.float64), \
        torch.randn(6, 3, generator=g, dtype=torch.float64)


def close(got, expected, what):
    if expected is None or got is None:
        assert got is None and expected is None, "%s: got %s, torch has %s" % (
            what, "None" if got is None else "a tensor", "None" if expected is None else "a tensor")
        return
    assert got.dtype == expected.dtype and got.shape == expected.shape, \
        "%s: %s %s vs torch's %s %s" % (what, got.dtype, tuple(got.shape), expected.dtype,
                                        tuple(expected.shape))
    diff = float((got.double() - expected.double()).abs().max()) if got.numel() else 0.0
    scale = max(1.0, float(expected.double().abs().max())) if got.numel() else 1.0
    assert diff <= TOL * scale, "%s differs from torch DDP by %.3g (scale %.3g)" % (
        what, diff, scale)


def run_case(what, net, dtype=torch.float32, micro=1, hook=None, tol=None, zero_to_none=True,
             **ddp_kwargs):
    global TOL
    saved_tol, TOL = TOL, tol or TOL
    torch.manual_seed(100 + RANK)  # different weights per rank: construction must broadcast
    base = net().to(dtype)
    ours = PerseusDDP(copy.deepcopy(base), **ddp_kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = TorchDDP(copy.deepcopy(base), **ddp_kwargs)
    if hook is not None:
        ours.register_comm_hook(None, hook)
        theirs.register_comm_hook(None, hook)
    for name, p in theirs.module.named_parameters():
        close(ours.module.get_parameter(name).detach(), p.detach(), "%s: initial %s" % (what, name))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ours, theirs)]
    for step in range(STEPS):
        for k in range(micro):
            x, y = batch(step, k)
            for model in (ours, theirs):
                sync = model.no_sync() if k < micro - 1 else contextlib.nullcontext()
                with sync:
                    loss = ((model(x.to(dtype), step) - y.to(dtype)) ** 2).mean()
                    loss.backward()
            where = "%s step %d pass %d" % (what, step, k)
            for name, p in theirs.module.named_parameters():
                close(ours.module.get_parameter(name).grad, p.grad, "%s: grad of %s" % (where, name))
            for name, b in theirs.module.named_buffers():
                close(ours.module.get_buffer(name), b, "%s: buffer %s" % (where, name))
        if ddp_kwargs.get("gradient_as_bucket_view"):
            check_bucket_views(ours, what)
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=zero_to_none)
    for name, p in theirs.module.named_parameters():
        close(ours.module.get_parameter(name).detach(), p.detach(), "%s: final %s" % (what, name))
    TOL = saved_tol
    log("%s: same as torch DDP" % what)


def check_bucket_views(ddp, what):
    reducer = ddp._reducer
    for i, p in enumerate(reducer.params):
        if p.grad is None:
            continue
        flat = reducer.bucket_of[i].flat
        assert p.grad.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr(), \
            "%s: .grad of %s is not a view of its bucket" % (what, reducer.names[i])


def body():
    global RANK
    RANK, size = launcher_rank_size()
    dist.init_process_group(backend="gloo")
    assert dist.get_rank() == RANK and dist.get_world_size() == size
    tdist.init_process_group("gloo", rank=RANK, world_size=size)

    run_case("bn_float32", BNNet)
    run_case("bn_float64", BNNet, dtype=torch.float64)
    run_case("unused", UnusedNet, find_unused_parameters=True)
    run_case("no_sync", BNNet, micro=3)
    run_case("no_sync_unused", UnusedNet, micro=2, find_unused_parameters=True)
    run_case("bucket_view", BNNet, gradient_as_bucket_view=True, bucket_cap_mb=0.001)
    run_case("bucket_view_zero_grad", BNNet, gradient_as_bucket_view=True, zero_to_none=False,
             micro=2)
    run_case("bucket_view_unused", UnusedNet, gradient_as_bucket_view=True,
             find_unused_parameters=True)
    run_case("one_bucket_per_param", BNNet, bucket_cap_mb=1e-6)
    run_case("no_buffer_broadcast", BNNet, broadcast_buffers=False)
    run_case("static_graph", StaticUnusedNet, static_graph=True)
    run_case("static_graph_reentrant_checkpoint", CheckpointNet, static_graph=True)
    run_case("fp16_hook", BNNet, hook=default_hooks.fp16_compress_hook, tol=2e-3)

    tdist.destroy_process_group()
    dist.destroy_process_group()


main(body)
