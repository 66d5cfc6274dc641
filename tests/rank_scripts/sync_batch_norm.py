"""SyncBatchNorm against a single-process torch.nn.BatchNorm{1,2,3}d over the
concatenated global batch.

Every rank rebuilds every rank's input (and the upstream gradient it feeds backward)
from a seed, so each computes the reference locally: a float64 torch BatchNorm on the
whole batch, which the module in float64 must match to 1e-10 and in float32 to a
float32 tolerance. Checked for (N, C), (N, C, L), (N, C, H, W), (N, C, D, H, W) inputs,
uneven per-rank batch sizes (one-sample ranks; empty ranks in one configuration), affine on/off,
momentum 0.1/None, track_running_stats on/off, over several training steps with an SGD
update between them: outputs, running mean/var (also bit-identical on every rank),
input gradients, weight/bias gradients (this rank's share, summed over ranks), then eval
mode (untracked: the whole batch's statistics, as Horovod's). Also counts the
collectives: one allgather per training forward, one allreduce per backward, none in
eval with running statistics. convert_sync_batchnorm on a small model is checked the same
way. Runs at any size, 1 included (no mpirun).
"""
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import hvd, init, main, make_tensor  # noqa: E402

import perseus.torch.mpi_ops as mpi_ops  # noqa: E402
import perseus.torch.sync_batch_norm as sbn  # noqa: E402
from perseus.torch.sync_batch_norm import SyncBatchNorm  # noqa: E402

C = 3
TRAILING = {1: [(), (5,)], 2: [(4, 5)], 3: [(2, 3, 4)]}
TORCH_BN = {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}
CONFIGS = [  # (affine, momentum, track_running_stats)
    (True, 0.1, True),
    (False, None, True),
    (True, 0.3, False),
]
STEPS = 3
LR = 0.1
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}
# The convert test runs convolutions and linear layers in float32 too: more rounding.
CONVERT_TOL = {torch.float64: 1e-10, torch.float32: 2e-4}

# Collectives made by the module, counted by wrapping the functions it calls.
CALLS = {"allgather": 0, "allreduce": 0}


def _counting(name, fn):
    def wrapper(*args, **kwargs):
        CALLS[name] += 1
        return fn(*args, **kwargs)
    return wrapper


mpi_ops.allgather = _counting("allgather", mpi_ops.allgather)
mpi_ops.allreduce = _counting("allreduce", mpi_ops.allreduce)
assert sbn._m is mpi_ops


def calls():
    return dict(CALLS)


def check(got, expected, dtype, what, tol=None, scale=0.0):
    """got (dtype) against a float64 expectation: |got - exp| <= tol * (1 + |exp| + scale).
    scale: the size of the terms `expected` sums, where they may cancel to about zero
    (a bias before a BatchNorm gets a gradient of zero, in float32 off by their rounding)."""
    assert got is not None, "%s: missing" % what
    assert got.dtype == dtype, "%s: dtype %s, expected %s" % (what, got.dtype, dtype)
    assert tuple(got.shape) == tuple(expected.shape), \
        "%s: shape %s, expected %s" % (what, tuple(got.shape), tuple(expected.shape))
    diff = (got.detach().cpu().to(torch.float64) - expected.detach().to(torch.float64)).abs()
    bound = (tol or TOL[dtype]) * (1 + expected.detach().to(torch.float64).abs() + scale)
    bad = ~(diff <= bound)
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError("%s: %d of %d elements off, worst %.3g; first at %d: got %r expected %r"
                             % (what, int(bad.sum()), bad.numel(), float(diff.max()), i,
                                got.flatten()[i].item(), expected.flatten()[i].item()))


def check_same_on_all_ranks(t, what):
    rows = hvd.allgather(t.detach().reshape(1, -1).clone())
    for r in range(rows.shape[0]):
        if not torch.equal(rows[r], rows[0]):
            raise AssertionError("%s differs between rank 0 and rank %d: %s vs %s"
                                 % (what, r, rows[0].tolist(), rows[r].tolist()))


def batch_patterns(size):
    return {
        "uneven": [[1, 4, 2, 3][r] for r in range(size)],
        "with_empty": [0 if r % 2 == 1 else 2 + r for r in range(size)],
    }


def inputs(tag, rows, trailing, dtype):
    """(per-rank inputs, per-rank upstream gradients), channel means offset from 0."""
    offset = torch.tensor([3.0, -20.0, 0.5]).reshape([1, C] + [1] * len(trailing))
    xs = [(make_tensor(tag + ".x", r, (n, C) + trailing, torch.float64) + offset).to(dtype)
          for r, n in enumerate(rows)]
    gs = [make_tensor(tag + ".g", r, (n, C) + trailing, torch.float64).to(dtype)
          for r, n in enumerate(rows)]
    return xs, gs


def init_params(tag, *modules):
    w = make_tensor(tag + ".w", 0, (C,), torch.float64) / 4 + 1
    b = make_tensor(tag + ".b", 0, (C,), torch.float64) / 4
    rm = make_tensor(tag + ".rm", 0, (C,), torch.float64) / 4
    rv = make_tensor(tag + ".rv", 0, (C,), torch.float64).abs() / 4 + 0.5
    with torch.no_grad():
        for m in modules:
            if m.affine:
                m.weight.copy_(w)
                m.bias.copy_(b)
            if m.track_running_stats:
                m.running_mean.copy_(rm)
                m.running_var.copy_(rv)


def run_case(rank, size, dims, trailing, dtype, config, pattern, rows, device=None):
    """device: where the SyncBatchNorm and this rank's batch live (a GPU in
    tests/rank_scripts/gpu_torch_training.py); the torch reference always runs on the CPU."""
    affine, momentum, track = config
    tag = "sbn.%dd.%s.%s.%s.%s" % (dims, "x".join(map(str, trailing)), str(dtype), config, pattern)
    mine = SyncBatchNorm(C, momentum=momentum, affine=affine,
                         track_running_stats=track).to(device=device, dtype=dtype)
    ref = TORCH_BN[dims](C, momentum=momentum, affine=affine,
                         track_running_stats=track).to(torch.float64)
    init_params(tag, mine, ref)
    starts = [sum(rows[:r]) for r in range(size)]
    lo, hi = starts[rank], starts[rank] + rows[rank]

    for step in range(STEPS):
        what = "%s step %d" % (tag, step)
        xs, gs = inputs("%s.%d" % (tag, step), rows, trailing, dtype)
        x = xs[rank].to(device).clone().requires_grad_(True)
        before = calls()
        y = mine(x)
        after_forward = calls()
        y.backward(gs[rank].to(device))
        after_backward = calls()
        if size > 1:
            assert after_forward["allgather"] == before["allgather"] + 1, "%s: forward allgathers" % what
            assert after_forward["allreduce"] == before["allreduce"], "%s: forward allreduces" % what
            assert after_backward["allreduce"] == after_forward["allreduce"] + 1, \
                "%s: backward allreduces" % what
            assert after_backward["allgather"] == after_forward["allgather"], "%s: backward gathers" % what
        if size == 1:
            assert after_backward == before, "%s: a world of one communicated" % what

        xr = torch.cat(xs).to(torch.float64).requires_grad_(True)
        yr = ref(xr)
        yr.backward(torch.cat(gs).to(torch.float64))

        check(y, yr[lo:hi], dtype, what + " output")
        check(x.grad, xr.grad[lo:hi], dtype, what + " input grad")
        if track:
            check(mine.running_mean, ref.running_mean, dtype, what + " running_mean")
            check(mine.running_var, ref.running_var, dtype, what + " running_var")
            assert int(mine.num_batches_tracked) == step + 1, what + " num_batches_tracked"
            check_same_on_all_ranks(torch.cat([mine.running_mean, mine.running_var]),
                                    what + " running_mean, running_var")
        if affine:
            # This rank's share, as torch's SyncBatchNorm: the ranks' shares sum to the total.
            gw, gb = hvd.grouped_allreduce([mine.weight.grad, mine.bias.grad], op=hvd.Sum)
            check(gw, ref.weight.grad, dtype, what + " weight grad")
            check(gb, ref.bias.grad, dtype, what + " bias grad")
            with torch.no_grad():
                mine.weight -= LR * gw
                mine.bias -= LR * gb
                ref.weight -= LR * ref.weight.grad
                ref.bias -= LR * ref.bias.grad
            mine.zero_grad()
            ref.zero_grad()

    # Eval: running statistics and no communication; untracked, the whole batch's
    # statistics (one allgather, as in training), as Horovod's SyncBatchNorm does.
    mine.eval()
    ref.eval()
    xs, _ = inputs(tag + ".eval", rows, trailing, dtype)
    before = calls()
    y = mine(xs[rank].to(device))
    after = calls()
    if track or size == 1:
        assert after == before, "%s: eval mode communicated" % tag
    else:
        assert after["allgather"] == before["allgather"] + 1, "%s: eval allgathers" % tag
    expected = ref(torch.cat(xs).to(torch.float64))[lo:hi]
    check(y, expected.detach(), dtype, tag + " eval output")


def run_convert(rank, size, dtype):
    """convert_sync_batchnorm on a model, trained a few steps against the original on the
    whole batch."""
    tag = "sbn.convert.%s" % dtype
    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(2, C, 3, padding=1), torch.nn.BatchNorm2d(C), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(C * 16, 4), torch.nn.BatchNorm1d(4, momentum=None),
    ).to(torch.float64)
    ref = model
    mine = SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model).to(dtype))
    kinds = [type(m).__name__ for m in mine]
    assert kinds == ["Conv2d", "SyncBatchNorm", "ReLU", "Flatten", "Linear", "SyncBatchNorm"], kinds
    assert mine[5].momentum is None
    rows = [r + 2 for r in range(size)]
    starts = [sum(rows[:r]) for r in range(size)]
    lo, hi = starts[rank], starts[rank] + rows[rank]
    for step in range(STEPS):
        what = "%s step %d" % (tag, step)
        xs = [make_tensor("%s.%d.x" % (tag, step), r, (n, 2, 4, 4), torch.float64).to(dtype)
              for r, n in enumerate(rows)]
        gs = [make_tensor("%s.%d.g" % (tag, step), r, (n, 4), torch.float64).to(dtype)
              for r, n in enumerate(rows)]
        x = xs[rank].clone().requires_grad_(True)
        y = mine(x)
        y.backward(gs[rank])
        xr = torch.cat(xs).to(torch.float64).requires_grad_(True)
        yr = ref(xr)
        yr.backward(torch.cat(gs).to(torch.float64))
        check(y, yr[lo:hi], dtype, what + " output", CONVERT_TOL[dtype])
        check(x.grad, xr.grad[lo:hi], dtype, what + " input grad", CONVERT_TOL[dtype])
        params = list(mine.named_parameters())
        summed = hvd.grouped_allreduce([p.grad for _, p in params], op=hvd.Sum)
        # At np 1 (a batch of 2) float32 torch.nn.BatchNorm1d alone puts the Linear's bias
        # gradient 2e-4 from zero (measured): the weight's gradients are 13.
        scale = max(float(pr.grad.abs().max()) for pr in ref.parameters())
        for (name, p), g, pr in zip(params, summed, ref.parameters()):
            check(g, pr.grad, dtype, "%s grad of %s" % (what, name), CONVERT_TOL[dtype], scale)
            with torch.no_grad():
                p -= LR * g
                pr -= LR * pr.grad
        for i in (1, 5):
            check(mine[i].running_mean, ref[i].running_mean, dtype, "%s [%d] running_mean" % (what, i), CONVERT_TOL[dtype])
            check(mine[i].running_var, ref[i].running_var, dtype, "%s [%d] running_var" % (what, i), CONVERT_TOL[dtype])
        mine.zero_grad()
        ref.zero_grad()
    mine.eval()
    ref.eval()
    x = make_tensor(tag + ".eval", 0, (3, 2, 4, 4), torch.float64)
    check(mine(x.to(dtype)), ref(x).detach(), dtype, tag + " eval output", CONVERT_TOL[dtype])


def run_errors(rank, size):
    m = SyncBatchNorm(C)
    try:
        m(torch.zeros(4))
    except ValueError:
        pass
    else:
        raise AssertionError("1-d input accepted")
    # One value per channel over the whole job: the same error on every rank.
    rows = [1 if r == 0 else 0 for r in range(size)]
    try:
        m(torch.ones(rows[rank], C))
    except ValueError as e:
        assert "more than 1 value per channel" in str(e), str(e)
    else:
        raise AssertionError("a global batch of one sample accepted in training")


def body():
    rank, size = init()
    for dtype in (torch.float64, torch.float32):
        for dims, trailings in TRAILING.items():
            for trailing in trailings:
                for config in CONFIGS:
                    for pattern, rows in batch_patterns(size).items():
                        if sum(rows) * max(1, int(torch.tensor(trailing).prod())) < 2 or \
                                (pattern == "with_empty" and config != CONFIGS[0]):
                            continue
                        run_case(rank, size, dims, trailing, dtype, config, pattern, rows)
        run_convert(rank, size, dtype)
    run_errors(rank, size)


if __name__ == "__main__":
    main(body)
