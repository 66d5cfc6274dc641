"""SyncBatchNorm: tests/rank_scripts/sync_batch_norm.py under mpirun at 2 and 4 ranks (against
torch BatchNorm over the concatenated global batch), plus a world of one in this
process: the module, and the synchronized autograd function itself, against torch."""
import copy
import importlib

import pytest
import torch

pytestmark = pytest.mark.timeout(120)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_sync_batch_norm_mpi(run_mpi, nprocs):
    run_mpi("sync_batch_norm", nprocs)


def _sbn():
    return importlib.import_module("perseus.torch.sync_batch_norm")


SHAPES = [(6, 3), (5, 3, 4), (4, 3, 3, 5), (3, 3, 2, 3, 4)]
BN = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d,
      5: torch.nn.BatchNorm3d}


def _data(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 7).to(dtype)
    gy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return x, gy


def _pair(shape, dtype, momentum, affine=True):
    sbn = _sbn()
    mine = sbn.SyncBatchNorm(3, momentum=momentum, affine=affine).to(dtype)
    ref = BN[len(shape)](3, momentum=momentum, affine=affine).to(dtype)
    with torch.no_grad():
        for m in (mine, ref):
            if affine:
                m.weight.copy_(torch.rand(3, generator=torch.Generator().manual_seed(1)) + 0.5)
                m.bias.copy_(torch.randn(3, generator=torch.Generator().manual_seed(2)))
    return mine, ref


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("momentum", [0.1, None])
def test_single_rank_module_matches_torch(initialized, shape, dtype, tol, momentum):
    mine, ref = _pair(shape, dtype, momentum)
    for step in range(3):
        x, gy = _data(shape, dtype, 100 + step)
        xm = x.clone().requires_grad_(True)
        xr = x.clone().requires_grad_(True)
        ym, yr = mine(xm), ref(xr)
        ym.backward(gy)
        yr.backward(gy)
        torch.testing.assert_close(ym, yr, rtol=tol, atol=tol)
        torch.testing.assert_close(xm.grad, xr.grad, rtol=tol, atol=tol)
        torch.testing.assert_close(mine.weight.grad, ref.weight.grad, rtol=tol, atol=tol)
        torch.testing.assert_close(mine.bias.grad, ref.bias.grad, rtol=tol, atol=tol)
        torch.testing.assert_close(mine.running_mean, ref.running_mean, rtol=tol, atol=tol)
        torch.testing.assert_close(mine.running_var, ref.running_var, rtol=tol, atol=tol)
    assert int(mine.num_batches_tracked) == 3
    mine.eval()
    ref.eval()
    x, _ = _data(shape, dtype, 999)
    torch.testing.assert_close(mine(x), ref(x), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_single_rank_sync_function_matches_torch(initialized, shape, dtype, tol, affine):
    """The collective path (allgather of stats, allreduce of gradient sums) in a world
    of one, which the module itself skips: same numbers as torch.nn.BatchNorm."""
    sbn = _sbn()
    mine, ref = _pair(shape, dtype, 0.1, affine)
    x, gy = _data(shape, dtype, 5)
    xm = x.clone().requires_grad_(True)
    xr = x.clone().requires_grad_(True)
    ym = sbn._SyncBatchNormFunction.apply(xm, mine.weight, mine.bias, mine.running_mean,
                                          mine.running_var, mine.eps, 0.1,
                                          initialized.global_process_set)
    yr = ref(xr)
    ym.backward(gy)
    yr.backward(gy)
    torch.testing.assert_close(ym, yr, rtol=tol, atol=tol)
    torch.testing.assert_close(xm.grad, xr.grad, rtol=tol, atol=tol)
    if affine:
        torch.testing.assert_close(mine.weight.grad, ref.weight.grad, rtol=tol, atol=tol)
        torch.testing.assert_close(mine.bias.grad, ref.bias.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(mine.running_mean, ref.running_mean, rtol=tol, atol=tol)
    torch.testing.assert_close(mine.running_var, ref.running_var, rtol=tol, atol=tol)


def test_convert_sync_batchnorm(initialized):
    sbn = _sbn()
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.Sequential(torch.nn.Flatten(), torch.nn.BatchNorm1d(16, momentum=None)))
    model[1].running_mean.fill_(0.5)
    model[1].num_batches_tracked.fill_(3)
    model.eval()
    original = copy.deepcopy(model)
    converted = sbn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(converted[1], sbn.SyncBatchNorm)
    assert isinstance(converted[2][1], sbn.SyncBatchNorm)
    assert converted[2][1].momentum is None
    assert not converted[1].training
    assert torch.equal(converted[1].running_mean, original[1].running_mean)
    assert int(converted[1].num_batches_tracked) == 3
    x = torch.randn(3, 2, 4, 4)
    torch.testing.assert_close(converted(x), original(x))
    # A bare BatchNorm becomes a SyncBatchNorm itself.
    assert isinstance(sbn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.BatchNorm1d(2)),
                      sbn.SyncBatchNorm)


def test_eval_mode_does_not_communicate(monkeypatch):
    """Eval mode uses the running statistics and makes no collective (so it also works
    before hvd.init())."""
    sbn = _sbn()

    def no_collectives(*args, **kwargs):
        raise AssertionError("eval mode communicated")

    monkeypatch.setattr(sbn._m, "allgather", no_collectives)
    monkeypatch.setattr(sbn._m, "allreduce", no_collectives)
    m = sbn.SyncBatchNorm(3)
    ref = torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        for b in (m, ref):
            b.running_mean.copy_(torch.tensor([1.0, -2.0, 0.5]))
            b.running_var.copy_(torch.tensor([2.0, 0.5, 1.5]))
    m.eval()
    ref.eval()
    x = torch.randn(4, 3, 2)
    torch.testing.assert_close(m(x), ref(x))


def test_input_errors(initialized):
    sbn = _sbn()
    m = sbn.SyncBatchNorm(3)
    with pytest.raises(ValueError, match="2D"):
        m(torch.randn(3))
    with pytest.raises(ValueError, match="more than 1 value"):
        m(torch.randn(1, 3))
