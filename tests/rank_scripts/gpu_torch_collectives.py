"""CUDA-only checks beside the collective scripts that tests/gpu/test_gpu.py reruns on CUDA
tensors (allreduce.py, allgather.py, ... with PTEST_DEVICE): large and odd sizes,
Compression.fp16 / bf16 on CUDA tensors, join(device=this GPU), what nccl_built()
and cuda_built() say, and results on the inputs' device. References on the CPU
(common.reference_reduce)."""
import torch

from common import (assert_close, assert_equal, assert_reduced, dtype_name, hvd, main, make_tensor,
                    op_name, reference_reduce)
from gpu_torch_common import init

from perseus.torch.compression import Compression

LARGE = (1 << 22) + 3   # odd, beyond one fusion buffer's worth of small tensors
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def large(rank, size):
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8):
        for op in OPS:
            if op == hvd.Product and dtype != torch.float32:
                continue  # products of millions of values: one dtype is enough
            name = "gc.large.%s.%s" % (op_name(op), dtype_name(dtype))
            kind = "product" if op == hvd.Product else "sum"
            xs = [make_tensor(name, r, (LARGE,), dtype, kind) for r in range(size)]
            assert_reduced(hvd.allreduce(xs[rank], name=name, op=op), xs, op, dtype, name)
    for dtype in (torch.float32, torch.bfloat16):
        name = "gc.large.scaled.%s" % dtype_name(dtype)
        xs = [make_tensor(name, r, (LARGE,), dtype) for r in range(size)]
        out = hvd.allreduce(xs[rank], name=name, op=hvd.Average, prescale_factor=0.5, postscale_factor=3.0)
        assert_reduced(out, xs, hvd.Average, dtype, name, prescale=0.5, postscale=3.0)
    # A big grouped allreduce: large and tiny tensors fused together, 2-D shapes.
    name = "gc.large.grouped"
    shapes = [(1 << 20, 3), (1,), (), (0,), (257, 129), (1 << 16,)]
    groups = [[make_tensor("%s.%d" % (name, i), r, s, torch.float32) for r in range(size)]
              for i, s in enumerate(shapes)]
    outs = hvd.grouped_allreduce([xs[rank] for xs in groups], name=name, op=hvd.Sum)
    for i, (out, xs) in enumerate(zip(outs, groups)):
        assert_reduced(out, xs, hvd.Sum, torch.float32, "%s[%d]" % (name, i))
    # Large data movement: uneven rows, odd row length.
    name = "gc.large.ag"
    xs = [make_tensor(name, r, ((1 << 16) + r, 37), torch.float16) for r in range(size)]
    assert_equal(hvd.allgather(xs[rank], name=name), torch.cat(xs), name)
    name = "gc.large.bc"
    xs = [make_tensor(name, r, (LARGE,), torch.int8) for r in range(size)]
    assert_equal(hvd.broadcast(xs[rank], size - 1, name=name), xs[size - 1], name)


def compressed(rank, size):
    """fp16 / bf16 on the wire: close to the exact result, not equal to it; integer
    tensors pass through uncompressed (exact)."""
    for compression, eps in ((Compression.fp16, 2.0 ** -10), (Compression.bf16, 2.0 ** -7)):
        for dtype in (torch.float32, torch.float64):
            for op in (hvd.Sum, hvd.Average):
                name = "gc.comp.%s.%s.%s" % (compression.__name__, dtype_name(dtype), op_name(op))
                xs = [make_tensor(name, r, (1000, 3), dtype) for r in range(size)]
                out = hvd.allreduce(xs[rank], name=name, op=op, compression=compression)
                expected, _ = reference_reduce(xs, op, dtype)
                # One rounding per addend and one for the result, relative to the addends.
                bound = (size + 2) * eps * torch.stack([x.cpu().double().abs() for x in xs]).sum(0) + 1e-6
                assert_close(out, expected, bound, dtype, name)
                diff = (out.cpu().double() - expected).abs().max().item()
                assert diff > 0, "%s: exact result, so the compression was not applied" % name
        name = "gc.comp.%s.grouped" % compression.__name__
        groups = [[make_tensor("%s.%d" % (name, i), r, (n,), torch.float32) for r in range(size)]
                  for i, n in enumerate((5, 0, 300))]
        outs = hvd.grouped_allreduce([xs[rank] for xs in groups], name=name, op=hvd.Sum,
                                     compression=compression)
        for i, (out, xs) in enumerate(zip(outs, groups)):
            expected, _ = reference_reduce(xs, hvd.Sum, torch.float32)
            bound = (size + 2) * eps * torch.stack([x.cpu().double().abs() for x in xs]).sum(0) + 1e-6
            assert_close(out, expected, bound, torch.float32, "%s[%d]" % (name, i))
        name = "gc.comp.%s.int" % compression.__name__
        xs = [make_tensor(name, r, (77,), torch.int32) for r in range(size)]
        assert_reduced(hvd.allreduce(xs[rank], name=name, op=hvd.Sum, compression=compression),
                       xs, hvd.Sum, torch.int32, name)


def join_on_device(rank, size, device):
    """Horovod scripts call hvd.join(hvd.local_rank()): the joined ranks' zeros for the
    others' CUDA allreduces, and the last rank to join."""
    steps = [r + 1 for r in range(size)]
    for step in range(steps[rank]):
        active = [r for r in range(size) if steps[r] > step]
        name = "gc.join.%d" % step
        xs = {r: make_tensor(name, r, (33,), torch.float32) for r in active}
        zeros = [torch.zeros(33)] * (size - len(active))
        assert_reduced(hvd.allreduce(xs[rank], name=name, op=hvd.Sum), list(xs.values()) + zeros,
                       hvd.Sum, torch.float32, name)
    index = device.index if device.type == "cuda" else -1  # -1: PTEST_GPU=cpu
    last = hvd.join(index)
    assert last == size - 1, "join(%d) returned %r, the last to join was %d" % (index, last, size - 1)


def body():
    rank, size, device = init(inputs_on_gpu=True)
    if device.type == "cuda":  # the machine has CUDA and the NCCL torch uses: both must load
        assert hvd.cuda_built() is True, "cuda_built() is %r on a CUDA machine" % hvd.cuda_built()
        assert hvd.nccl_built(), "nccl_built() is %r on a CUDA machine with NCCL" % hvd.nccl_built()
    large(rank, size)
    compressed(rank, size)
    join_on_device(rank, size, device)
    hvd.barrier()
    hvd.shutdown()


main(body)
