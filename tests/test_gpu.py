"""CUDA tensors in a world of one (one GPU cannot host two NCCL ranks). Skipped cleanly
where torch sees no CUDA device."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64]


def make(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype).cuda()
    return torch.randint(0, 50, shape, generator=g).to(dtype).cuda()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_collectives_on_cuda_tensors(hvd, dtype):
    for i, shape in enumerate([(), (17,), (1 << 16,), (3, 4)]):
        x = make(shape, dtype, seed=i)
        tag = "gpu.%s.%d" % (dtype, i)
        for op in (hvd.Sum, hvd.Min, hvd.Max):
            out = hvd.allreduce(x, name="%s.%s" % (tag, op), op=op)
            assert out.device == x.device and torch.equal(out, x)
        y = x.clone()
        hvd.allreduce_(y, name=tag + ".inplace", op=hvd.Sum)
        assert torch.equal(y, x)
        assert torch.equal(hvd.broadcast(x, 0, name=tag + ".bc"), x)
        if x.dim():
            out = hvd.allgather(x, name=tag + ".ag")
            assert out.device == x.device and torch.equal(out, x)
    if dtype.is_floating_point:
        x = make((1000,), dtype)
        out = hvd.allreduce(x, name="gpu.scale.%s" % dtype, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
        torch.testing.assert_close(out, x * 0.5)


def test_grouped_and_async_on_cuda(hvd):
    xs = [make((n,), torch.float32, seed=n) for n in (1, 100, 10000)]
    outs = hvd.grouped_allreduce(xs, name="gpu.grouped", op=hvd.Sum)
    for out, x in zip(outs, xs):
        assert out.is_cuda and torch.equal(out, x)
    handles = [hvd.allreduce_async(x, name="gpu.async.%d" % i, op=hvd.Sum) for i, x in enumerate(xs)]
    for handle, x in zip(handles, xs):
        assert torch.equal(hvd.synchronize(handle), x)
