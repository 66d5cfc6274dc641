"""The torch.distributed backend "perseus" (issue 38): torch's own API, DDP, FSDP2 and
ZeroRedundancyOptimizer over init_process_group("perseus"), checked against plain
torch, against the same DDP over gloo (a gloo group of every rank over the store the
backend made) and against one process training on the whole batch.

1. Registration: `import perseus.torch` alone makes "perseus" known; ranks come from
   MPI, and a script's contradicting init_method, world_size and rank are accepted
   with one warning; new_group() makes a process set (members only take part).
2. Every collective DDP, FSDP2, ZeRO and the object collectives use, with async
   futures chained, each against a reference computed here from every rank's input
   (small integers: exact in any summation order); complex tensors too, as gloo takes
   them (complex_checks.py).
3. torch's DDP over perseus and over gloo: the same parameters, to the bit, after
   every step, with static_graph, find_unused_parameters, no_sync, join() with uneven
   inputs and the fp16, bf16 and PowerSGD comm hooks. A sum of two floats is the
   same whatever the algorithm, but a sum of four depends on its order, which MPI
   and gloo choose differently: at np 4 only ranks 0 and 1 carry a loss (the others
   run every pass with their loss times zero), so each sum is again one rounding.
   One case where all four contribute is checked to rounding instead, and a sparse
   embedding's gradients (summed here from every rank's entries). Complex parameters
   too.
4. FSDP2 (fully_shard) against one process on the whole batch, to rounding;
   ZeroRedundancyOptimizer against the plain optimizer, to the bit.
5. Ranks that disagree on a shape or an op fail on every rank, and later calls work;
   point-to-point operations raise naming the op and the backends that have it.
"""
import contextlib
import copy
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.distributed.algorithms.join import Join
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from common import expect_raises, launcher_rank_size, log, main, make_tensor
from complex_checks import check_complex
from tensor_write_checks import (check_bitwise_reductions, check_bool_reductions,
                                 check_tensor_writes)

import perseus.torch  # noqa: F401 - registers the backend

RANK = SIZE = None


def equal(got, expected, what):
    assert got.dtype == expected.dtype and got.shape == expected.shape, \
        "%s: %s %s, expected %s %s" % (what, got.dtype, tuple(got.shape), expected.dtype,
                                       tuple(expected.shape))
    if not torch.equal(got, expected):
        diff = float((got.double() - expected.double()).abs().max())
        raise AssertionError("%s: differs from the reference by up to %.3g" % (what, diff))


# ---------------------------------------------------------------- 1. registration

def init():
    """init_process_group("perseus") with what a torch script passes: a tcp:// address
    nobody listens on and its own world size and rank. MPI's win, with one warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("perseus", init_method="tcp://127.0.0.1:9", world_size=SIZE + 3,
                                rank=0)
    said = [str(w.message) for w in caught if "contradicts the MPI job" in str(w.message)]
    assert len(said) == 1, "expected one warning about world_size, got %s" % said
    assert dist.get_backend() == "perseus", dist.get_backend()
    assert (dist.get_rank(), dist.get_world_size()) == (RANK, SIZE)


def check_groups():
    upper = list(range(1, SIZE))  # np 2: [1]
    odd = list(range(1, SIZE, 2))  # np 2: [1] again: the same process set
    for ranks in (upper, odd):
        group = dist.new_group(ranks)
        if RANK not in ranks:
            assert group == dist.GroupMember.NON_GROUP_MEMBER
            continue
        assert dist.get_backend(group) == "perseus"
        assert dist.get_rank(group) == ranks.index(RANK)
        t = make_tensor("group", RANK, (4,), torch.float64, kind="exact")
        expected = sum(make_tensor("group", r, (4,), torch.float64, kind="exact") for r in ranks)
        dist.all_reduce(t, group=group)
        equal(t, expected, "all_reduce in the group %s" % ranks)
        out = [torch.empty(2, dtype=torch.int64) for _ in ranks]
        dist.all_gather(out, torch.tensor([RANK, 7]), group=group)
        equal(torch.stack(out), torch.tensor([[r, 7] for r in ranks]), "all_gather in %s" % ranks)
    log("groups: ok")


# ---------------------------------------------------------------- 2. collectives

def inputs(tag, shape, dtype=torch.float64):
    return [make_tensor(tag, r, shape, dtype, kind="exact") for r in range(SIZE)]


def check_reductions():
    ops = {dist.ReduceOp.SUM: lambda xs: xs.sum(0), dist.ReduceOp.AVG: lambda xs: xs.mean(0),
           dist.ReduceOp.MAX: lambda xs: xs.amax(0), dist.ReduceOp.MIN: lambda xs: xs.amin(0),
           dist.ReduceOp.PRODUCT: lambda xs: xs.prod(0)}
    for op, reference in ops.items():
        xs = inputs("allreduce.%s" % op, (3, 5))
        t = xs[RANK].clone()
        dist.all_reduce(t, op=op)
        equal(t, reference(torch.stack(xs)), "all_reduce %s" % op)
    # async: the future completes with the result, and then() chains on it.
    xs = inputs("allreduce.async", (7,))
    t = xs[RANK].clone()
    work = dist.all_reduce(t, async_op=True)
    doubled = work.get_future().then(lambda f: f.value()[0] * 2).wait()
    assert work.wait() and work.is_completed()
    equal(doubled, 2 * sum(xs), "all_reduce future chained")
    # coalesced: one grouped request
    a, b = inputs("coalesced.a", (4,)), inputs("coalesced.b", (2, 3))
    ta, tb = a[RANK].clone(), b[RANK].clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in torch, still what it calls
        dist.all_reduce_coalesced([ta, tb])
    equal(ta, sum(a), "all_reduce_coalesced a")
    equal(tb, sum(b), "all_reduce_coalesced b")
    # reduce: the root gets the sum, the others keep their tensor
    xs = inputs("reduce", (6,))
    t = xs[RANK].clone()
    dist.reduce(t, dst=SIZE - 1)
    equal(t, sum(xs) if RANK == SIZE - 1 else xs[RANK], "reduce")
    # reduce_scatter (a list of chunks) and reduce_scatter_tensor
    xs = inputs("reduce_scatter", (SIZE * 2, 3))
    expected = sum(xs).chunk(SIZE)[RANK]
    out = torch.empty(2, 3, dtype=torch.float64)
    dist.reduce_scatter(out, list(xs[RANK].chunk(SIZE)))
    equal(out, expected, "reduce_scatter")
    out = torch.empty(2, 3, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, xs[RANK].clone(), op=dist.ReduceOp.AVG)
    equal(out, sum(xs).chunk(SIZE)[RANK] / SIZE, "reduce_scatter_tensor AVG")
    log("reductions: ok")


def check_data_movement():
    xs = inputs("broadcast", (3, 2), torch.int64)
    t = xs[RANK].clone()
    dist.broadcast(t, src=SIZE - 1)
    equal(t, xs[SIZE - 1], "broadcast")
    xs = inputs("all_gather", (2, 3))
    out = [torch.empty(2, 3, dtype=torch.float64) for _ in range(SIZE)]
    dist.all_gather(out, xs[RANK])
    equal(torch.stack(out), torch.stack(xs), "all_gather")
    for shape in ((SIZE * 2, 3), (SIZE, 2, 3)):
        out = torch.empty(shape, dtype=torch.float64)
        work = dist.all_gather_into_tensor(out, xs[RANK], async_op=True)
        work.wait()
        equal(out.reshape(SIZE, 2, 3), torch.stack(xs), "all_gather_into_tensor %s" % (shape,))
    # all_to_all_single with uneven splits: rank r sends r + k + 1 rows to rank k
    sent = {r: [r + k + 1 for k in range(SIZE)] for r in range(SIZE)}
    xs = [make_tensor("a2a", r, (sum(sent[r]), 2), torch.int32, kind="exact") for r in range(SIZE)]
    pieces = {r: list(xs[r].split(sent[r])) for r in range(SIZE)}
    expected = torch.cat([pieces[r][RANK] for r in range(SIZE)])
    out = torch.empty_like(expected)
    dist.all_to_all_single(out, xs[RANK], [sent[r][RANK] for r in range(SIZE)], sent[RANK])
    equal(out, expected, "all_to_all_single")
    outs = [torch.empty(3, dtype=torch.float64) for _ in range(SIZE)]
    ins = [make_tensor("a2a.list", RANK * SIZE + k, (3,), torch.float64, kind="exact")
           for k in range(SIZE)]
    dist.all_to_all(outs, ins)
    for r in range(SIZE):
        equal(outs[r], make_tensor("a2a.list", r * SIZE + RANK, (3,), torch.float64,
                                   kind="exact"), "all_to_all from rank %d" % r)
    # gather to the last rank, scatter from rank 0
    xs = inputs("gather", (4,))
    outs = [torch.empty(4, dtype=torch.float64) for _ in range(SIZE)] if RANK == SIZE - 1 else None
    dist.gather(xs[RANK], outs, dst=SIZE - 1)
    if RANK == SIZE - 1:
        equal(torch.stack(outs), torch.stack(xs), "gather")
    xs = inputs("scatter", (3,))
    out = torch.empty(3, dtype=torch.float64)
    dist.scatter(out, xs if RANK == 0 else None, src=0)
    equal(out, xs[RANK], "scatter")
    dist.barrier()
    log("data movement: ok")


def check_objects():
    mine = {"rank": RANK, "payload": list(range(RANK * 3))}
    everyone = [{"rank": r, "payload": list(range(r * 3))} for r in range(SIZE)]
    got = [None] * SIZE
    dist.all_gather_object(got, mine)
    assert got == everyone, got
    items = [mine, "x" * RANK]
    dist.broadcast_object_list(items, src=SIZE - 1)
    assert items == [everyone[SIZE - 1], "x" * (SIZE - 1)], items
    gathered = [None] * SIZE if RANK == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if RANK == 0:
        assert gathered == everyone, gathered
    out = [None]
    dist.scatter_object_list(out, everyone if RANK == 0 else None, src=0)
    assert out == [everyone[RANK]], out
    log("object collectives: ok")


# ---------------------------------------------------------------- 3. DDP against gloo

class Net(nn.Module):
    """BatchNorm (buffers broadcast before each forward), a branch some ranks skip at
    some steps (`extra`, for find_unused_parameters) and one never used (`spare`)."""

    def __init__(self, skip=False):
        super().__init__()
        self.fc1 = nn.Linear(6, 12)
        self.bn = nn.BatchNorm1d(12)
        self.extra = nn.Linear(12, 12)
        self.fc2 = nn.Linear(12, 3)
        self.spare = nn.Linear(2, 2) if skip else None
        self.skip = skip

    def forward(self, x, step):
        h = torch.tanh(self.bn(self.fc1(x)))
        if not self.skip or (RANK + step) % 2 == 0:
            h = h + torch.relu(self.extra(h))
        return self.fc2(h)


class ComplexNet(nn.Module):
    """Complex parameters: torch's DDP broadcasts them as they are and reduces their
    gradients' real views."""

    def __init__(self, skip=False):
        super().__init__()
        self.fc1 = nn.Linear(6, 4, dtype=torch.complex64)
        self.fc2 = nn.Linear(4, 3, dtype=torch.complex64)

    def forward(self, x, step):
        return self.fc2(torch.tanh(self.fc1(torch.complex(x, x.flip(-1))))).abs()


def batch(step, micro=0):
    g = torch.Generator().manual_seed(1000 * RANK + 10 * step + micro)
    return torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)


def loss_weight(everyone):
    """1 for the ranks whose loss counts (see the docstring: 0 for ranks 2 and 3 at np
    4, unless `everyone`)."""
    return 1.0 if everyone or RANK < 2 else 0.0


def ddp_pair(name, gloo, skip=False, hook=None, state=None, net=Net, **kwargs):
    """The same module (weights differ per rank: construction must broadcast rank
    0's) under DDP over perseus and over gloo, with SGD."""
    torch.manual_seed(5 + RANK)
    base = net(skip)
    pair = []
    for group in (None, gloo):
        model = DDP(copy.deepcopy(base), process_group=group, **kwargs)
        if hook is not None:
            model.register_comm_hook(state(group) if state else group, hook)
        pair.append((model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)))
    return pair


def same_parameters(pair, what, exact=True):
    (ours, _), (theirs, _) = pair
    for (name, p), q in zip(ours.module.named_parameters(), theirs.module.parameters()):
        if exact:
            equal(p.detach(), q.detach(), "%s: %s" % (what, name))
        else:
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6,
                                       msg=lambda m: "%s: %s: %s" % (what, name, m))
    for (name, b), c in zip(ours.module.named_buffers(), theirs.module.buffers()):
        equal(b, c, "%s: buffer %s" % (what, name))


def train(pair, what, steps=3, micro=1, everyone=False, exact=True):
    weight = loss_weight(everyone)
    for step in range(steps):
        for model, opt in pair:
            for k in range(micro):
                x, y = batch(step, k)
                sync = model.no_sync() if k < micro - 1 else contextlib.nullcontext()
                with sync:
                    (weight * ((model(x, step) - y) ** 2).mean()).backward()
            opt.step()
            opt.zero_grad()
        same_parameters(pair, "%s after step %d" % (what, step), exact)
    log("DDP %s: same as over gloo" % what)


def check_ddp(gloo):
    train(ddp_pair("plain", gloo), "plain")
    if SIZE > 2:
        train(ddp_pair("everyone", gloo), "every rank contributing", everyone=True, exact=False)
    train(ddp_pair("static_graph", gloo, static_graph=True), "static_graph")
    train(ddp_pair("unused", gloo, skip=True, find_unused_parameters=True),
          "find_unused_parameters")
    train(ddp_pair("no_sync", gloo), "no_sync", micro=3)
    train(ddp_pair("complex", gloo, net=ComplexNet), "complex parameters")
    for name, hook in (("fp16", default_hooks.fp16_compress_hook), ("bf16", bf16_hook)):
        train(ddp_pair(name, gloo, hook=hook), "%s hook" % name)
    # PowerSGD from its third step on (its own warm-up allreduces the first two); its
    # callbacks wait for further allreduces inside the future chain. At np 4 without
    # error feedback, which would give the ranks without a loss a gradient of their own.
    train(ddp_pair("powersgd", gloo, hook=powersgd.powerSGD_hook,
                   state=lambda g: powersgd.PowerSGDState(
                       process_group=g, matrix_approximation_rank=1, start_powerSGD_iter=2,
                       use_error_feedback=SIZE == 2)),
          "PowerSGD hook", steps=4)
    check_join(gloo)
    check_sparse_gradient(gloo)


def check_sparse_gradient(gloo):
    """A sparse embedding: DDP's reducer all_reduces its gradient as one sparse tensor
    (issue 48, part 2; the backend gathers every rank's entries and sums them here)."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.EmbeddingBag(10, 3, sparse=True), nn.Linear(3, 1))
    pair = []
    for group in (None, gloo):
        model = DDP(copy.deepcopy(base), process_group=group)
        pair.append((model, torch.optim.SGD(model.parameters(), lr=0.1)))
    for step in range(3):
        for model, opt in pair:
            model(torch.tensor([[RANK, step + 2]])).sum().backward()
            opt.step()
            opt.zero_grad()
    for p, q in zip(pair[0][0].parameters(), pair[1][0].parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), msg=lambda m: "sparse DDP: " + m)
    log("DDP sparse gradients: same as over gloo")


def bf16_hook(state, bucket):
    """torch's bf16_compress_hook: DDP refuses it by name where torch has no CUDA and
    NCCL, whatever the backend, so it is registered under this one."""
    return default_hooks.bf16_compress_hook(state, bucket)


def check_join(gloo):
    """Uneven inputs: rank r has 2 + r batches; join() shadows the finished ranks."""
    pair = ddp_pair("join", gloo)
    weight = loss_weight(False)
    for model, opt in pair:
        with Join([model]):
            for step in range(2 + RANK):
                x, y = batch(step)
                (weight * ((model(x, step) - y) ** 2).mean()).backward()
                opt.step()
                opt.zero_grad()
    same_parameters(pair, "join")
    log("DDP join: same as over gloo")


# ---------------------------------------------------------------- 4. FSDP2 and ZeRO

def check_fsdp():
    """fully_shard over perseus, each rank a quarter of the batch, against one process
    on the whole batch: the same parameters to rounding after 3 steps of Adam."""
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 3))
    reference = copy.deepcopy(model)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    for step in range(3):
        data = [torch.randn(4, 6, generator=torch.Generator().manual_seed(50 * step + r))
                for r in range(SIZE)]
        model(data[RANK]).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        reference(torch.cat(data)).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.full_tensor().detach(), q.detach(), rtol=1e-5, atol=1e-6,
                                   msg=lambda m: "FSDP2 %s: %s" % (name, m))
    log("FSDP2: same as one process on the whole batch")


def check_zero():
    """ZeroRedundancyOptimizer(Adam) against Adam, each under DDP over perseus."""
    torch.manual_seed(21)
    base = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 3))
    runs = []
    for zero in (True, False):
        model = DDP(copy.deepcopy(base))
        opt = (ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                       lr=0.01) if zero
               else torch.optim.Adam(model.parameters(), lr=0.01))
        for step in range(3):
            x, y = batch(step)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        runs.append(model)
    for (name, p), q in zip(runs[0].module.named_parameters(), runs[1].module.parameters()):
        equal(p.detach(), q.detach(), "ZeroRedundancyOptimizer: %s" % name)
    log("ZeroRedundancyOptimizer: same as Adam")


# ---------------------------------------------------------------- 5. errors

def check_errors():
    expect_raises(RuntimeError, "all_reduce of shapes that differ",
                  dist.all_reduce, torch.ones(RANK + 1), contains=("shape",))
    op = dist.ReduceOp.SUM if RANK == 0 else dist.ReduceOp.MAX
    expect_raises(RuntimeError, "all_reduce of ops that differ",
                  dist.all_reduce, torch.ones(3), op=op, contains=("reduce op", "Sum", "Max"))
    t = torch.ones(3)
    dist.all_reduce(t)
    equal(t, torch.full((3,), float(SIZE)), "all_reduce after the mismatches")
    # Point-to-point works (tests/rank_scripts/torch_p2p.py); a peer outside the group
    # is refused before anything is sent.
    expect_raises(ValueError, "send to a rank outside", dist.send, t, SIZE + 3)
    log("errors: ok")


def body():
    global RANK, SIZE
    RANK, SIZE = launcher_rank_size()
    os.environ.pop("MASTER_ADDR", None)
    os.environ.pop("MASTER_PORT", None)  # nothing for torch's env:// rendezvous
    init()
    gloo = dist.new_group(backend="gloo")  # over the store the backend made
    check_groups()
    check_reductions()
    check_data_movement()
    check_complex(dist, RANK, SIZE)
    check_tensor_writes(dist, RANK, SIZE, "backend")
    check_bool_reductions(dist, RANK, SIZE, "backend")
    check_bitwise_reductions(dist, RANK, SIZE, "backend")
    log("complex tensors: ok")
    check_objects()
    check_errors()
    check_ddp(gloo)
    check_fsdp()
    check_zero()
    dist.destroy_process_group()


main(body)
