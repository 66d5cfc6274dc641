"""Every collective on CUDA tensors at sizes on both sides of every size boundary, checked
element by element against a CPU reference: the blocks of NCCL's one-rank kernel
(16 KiB each, at most 32: 512 KiB), the GPU hold (1 MiB), the MPI chunk and window
(4 MiB), 16 MiB of float32 (where NCCL 2.28.9 on an H100 left the last elements of
(1 << 22) + 3 and + 5 unwritten in one-rank scaled reductions), and a fused pair on
both sides of the fusion threshold (64 MiB). Each size is reduced out of place and in
place, plain, averaged and scaled. The fake-GPU counterpart is gpu_sizes.py.

PTEST_SIZES_LARGEST (bytes) leaves out larger boundaries (for PTEST_GPU=cpu runs)."""
import os

import torch

from common import assert_equal, assert_reduced, hvd, main, make_tensor
from gpu_torch_common import init, synchronize

KIB, MIB = 1 << 10, 1 << 20
LARGEST = int(os.environ.get("PTEST_SIZES_LARGEST", 64 * MIB))
BOUNDARIES = [b for b in (16 * KIB, 512 * KIB, MIB, 4 * MIB, 16 * MIB) if b <= LARGEST]
CASES = [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 1.0, 3.0), (hvd.Average, 2.0, 1.0)]


def around(nbytes, dtype):
    at = nbytes // dtype.itemsize
    return [at - 1, at, at + 3, at + 5]


def allreduces(rank, size, n, dtype):
    for op, pre, post in CASES:
        tag = "sz.ar.%d.%s.%g.%g.%s" % (n, op, pre, post, dtype)
        xs = [make_tensor(tag, r, (n,), dtype, "exact") for r in range(size)]
        out = hvd.allreduce(xs[rank], name=tag, op=op, prescale_factor=pre, postscale_factor=post)
        assert_reduced(out, xs, op, dtype, tag + " out of place", pre, post, exact=True)
        x = xs[rank].clone()
        hvd.allreduce_(x, name=tag + "_", op=op, prescale_factor=pre, postscale_factor=post)
        assert_reduced(x, xs, op, dtype, tag + " in place", pre, post, exact=True)


def others(rank, size, n):
    dtype = torch.float32
    tag = "sz.o.%d" % n
    xs = [make_tensor(tag, r, (n,), dtype, "exact") for r in range(size)]
    assert_equal(hvd.broadcast(xs[rank], size - 1, name=tag + ".bc"), xs[size - 1], tag + " broadcast")
    assert_equal(hvd.allgather(xs[rank], name=tag + ".ag"), torch.cat(xs), tag + " allgather")
    rows = [make_tensor(tag + ".a2a", r, (size, n // size), dtype, "exact") for r in range(size)]
    out = hvd.alltoall(rows[rank], name=tag + ".a2a")
    assert_equal(out, torch.cat([rows[r][rank:rank + 1] for r in range(size)]), tag + " alltoall")
    for op, pre, post in CASES[:3]:
        name = "%s.rs.%s.%g" % (tag, op, post)
        col = [x.view(n, 1) for x in xs]  # n rows: uneven over the ranks when n is odd
        counts = [n // size + (1 if r < n % size else 0) for r in range(size)]
        start = sum(counts[:rank])
        out = hvd.reducescatter(col[rank], name=name, op=op, prescale_factor=pre, postscale_factor=post)
        expected_from = [c[start:start + counts[rank]] for c in col]
        assert_reduced(out, expected_from, op, dtype, name, pre, post, exact=True)


def fused_pair(rank, size, threshold):
    """Two tensors that share one fusion buffer only below the threshold."""
    dtype = torch.float32
    for total in (threshold - 4, threshold, threshold + 20):
        n1 = total // 4 // 2 + 1
        n2 = total // 4 - n1
        tag = "sz.fused.%d" % total
        groups = [[make_tensor("%s.%d" % (tag, k), r, (n,), dtype, "exact") for r in range(size)]
                  for k, n in enumerate((n1, n2))]
        outs = hvd.grouped_allreduce([g[rank] for g in groups], name=tag, op=hvd.Average,
                                     postscale_factor=3.0)
        for k, (out, g) in enumerate(zip(outs, groups)):
            assert_reduced(out, g, hvd.Average, dtype, "%s[%d]" % (tag, k), postscale=3.0, exact=True)


def body():
    rank, size, device = init(inputs_on_gpu=True)
    for nbytes in BOUNDARIES:
        for n in around(nbytes, torch.float32):
            allreduces(rank, size, n, torch.float32)
            others(rank, size, n)
        for dtype in (torch.float16, torch.bfloat16, torch.float64):  # other pack sizes
            allreduces(rank, size, around(nbytes, dtype)[2], dtype)
    if 64 * MIB <= LARGEST:
        fused_pair(rank, size, 64 * MIB)
    synchronize()
    hvd.shutdown()


main(body)
