"""Every collective on GPU tensors at sizes on both sides of every size boundary, on the
fake CUDA runtime and NCCL (tests/gpu_fakes), checked element by element against numpy.

The boundaries: the chunk of the MPI algorithms and their windows (PERSEUS_CHUNK_SIZE),
the GPU hold (1 MiB), the fusion threshold, the blocks of NCCL's one-rank kernel (16 KiB
each, at most 32, so 512 KiB) and 16 MiB of float32, where an H100 with NCCL 2.28.9
left the last elements of (1 << 22) + 3 and + 5 unwritten: the fake models that bug
of NCCL's one-rank reductions that scale (Average, pre/postscale), so these cases fail
unless Perseus makes such a call in whole pieces. Each size is reduced out of place
and in place, plain and scaled; fused pairs straddle the fusion threshold.

Environment: FAKE_GPU_LIB; GPU_MODE = nccl or staged (as gpu_collectives.py);
PERSEUS_CHUNK_SIZE and PERSEUS_FUSION_THRESHOLD as the test sets them; GPU_SIZES_LARGEST
(bytes) leaves out larger boundaries (the slow 16 MiB ones, where four ranks share two
cores).
"""
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import capi  # noqa: E402
from support.capi import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCESCATTER  # noqa: E402
from gpu_collectives import assert_fake_released, reduce_ref  # noqa: E402
from support.rank_script import log, main  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20


def boundaries_bytes():
    chunk = int(os.environ.get("PERSEUS_CHUNK_SIZE", 4 * MIB))
    fusion = int(os.environ.get("PERSEUS_FUSION_THRESHOLD", 64 * MIB))
    largest = int(os.environ.get("GPU_SIZES_LARGEST", 16 * MIB))
    return sorted(b for b in {chunk, fusion, MIB, 16 * KIB, 512 * KIB, 16 * MIB} if b <= largest)


def counts_around(nbytes, esize):
    """Element counts just below, at and just above a boundary, odd ones included."""
    at = nbytes // esize
    return [at - 1, at, at + 3, at + 5]


def values(tag, rank, n, dtype):
    """Small integers, so that every sum and average below is exact."""
    rng = np.random.default_rng(zlib.crc32(("%s|%d" % (tag, rank)).encode()))
    return rng.integers(-4, 5, size=n).astype(dtype)


def check(out, expected, what):
    if out.shape != expected.shape:
        raise AssertionError("%s: shape %s, expected %s" % (what, out.shape, expected.shape))
    bad = np.flatnonzero(out != expected)
    if bad.size:
        i = bad[0]
        raise AssertionError("%s: %d of %d elements wrong; first at %d: got %r, expected %r"
                             % (what, bad.size, out.size, i, out.flat[i], expected.flat[i]))


ALLREDUCE_CASES = [  # (op, prescale, postscale)
    (capi.SUM, 1.0, 1.0), (capi.AVERAGE, 1.0, 1.0), (capi.SUM, 1.0, 3.0), (capi.AVERAGE, 2.0, 1.0)]


def check_allreduce(rank, size, device, n, dtype):
    xs = [values("ar%d" % n, r, n, dtype) for r in range(size)]
    # reduce_ref of every case from one float64 sum: the values are small integers and
    # the prescales 1 and 2, so sum(x * pre) == sum(x) * pre exactly.
    total = np.stack([x.astype(np.float64) for x in xs]).sum(0)
    for op, pre, post in ALLREDUCE_CASES:
        what = "allreduce of %d %s (op %d, pre %g, post %g)" % (n, np.dtype(dtype).name, op, pre, post)
        factor = post / size if op == capi.AVERAGE else post
        scaled = total * pre * factor if (pre, factor) != (1.0, 1.0) else total
        expected = scaled.astype(dtype)
        out = capi.run(ALLREDUCE, "ar.%d.%d.%g.%g" % (n, op, pre, post), xs[rank], device=device,
                       reduce_op=op, prescale=pre, postscale=post)
        check(out, expected, what + ", out of place")
        x = xs[rank].copy()
        capi.run(ALLREDUCE, "ar_.%d.%d.%g.%g" % (n, op, pre, post), x, out=x, device=device,
                 reduce_op=op, prescale=pre, postscale=post)
        check(x, expected, what + ", in place")


def check_fused_pair(rank, size, device, fusion, dtype):
    """Two tensors that fit one fusion buffer only together below the threshold."""
    esize = np.dtype(dtype).itemsize
    for total in (fusion - esize, fusion, fusion + 5 * esize):
        n1 = total // esize // 2 + 1
        n2 = total // esize - n1
        xs = {k: [values("fp%d.%d" % (total, k), r, n, dtype) for r in range(size)]
              for k, n in ((1, n1), (2, n2))}
        for op, pre, post in ALLREDUCE_CASES[1:3]:
            tags = ["fused.%d.%d.%d.%g" % (total, k, op, post) for k in (1, 2)]
            pend = capi.submit(*[capi.request(ALLREDUCE, t, xs[k][rank], device=device, reduce_op=op,
                                              prescale=pre, postscale=post)
                                 for t, k in zip(tags, (1, 2))])
            for t, k, p in zip(tags, (1, 2), pend):
                check(p.value(), reduce_ref(xs[k], op, dtype, pre, post), t)


def check_others(rank, size, device, n, dtype):
    """Broadcast, allgather, alltoall and reducescatter with n elements per rank."""
    root = size - 1
    xs = [values("o%d" % n, r, n, dtype) for r in range(size)]
    check(capi.run(BROADCAST, "bc.%d" % n, xs[rank], device=device, root=root), xs[root],
          "broadcast of %d" % n)
    check(capi.run(ALLGATHER, "ag.%d" % n, xs[rank], device=device), np.concatenate(xs),
          "allgather of %d" % n)
    rows = [values("a2a%d.%d" % (n, r), r, (n // size) * size, dtype).reshape(size, -1)
            for r in range(size)]
    out, _ = capi.run(ALLTOALL, "a2a.%d" % n, rows[rank], device=device)
    check(out, np.concatenate([rows[r][rank:rank + 1] for r in range(size)]), "alltoall of %d" % n)
    for op, pre, post in ((capi.SUM, 1.0, 1.0), (capi.AVERAGE, 1.0, 1.0), (capi.SUM, 1.0, 3.0)):
        full = [x.reshape(-1, 1) for x in xs]  # n rows: uneven over the ranks when n is odd
        counts = [n // size + (1 if r < n % size else 0) for r in range(size)]
        start = sum(counts[:rank])
        out = np.full((counts[rank], 1), 99, dtype=dtype)
        capi.run(REDUCESCATTER, "rs.%d.%d.%g" % (n, op, post), full[rank], device=device,
                 reduce_op=op, prescale=pre, postscale=post, out=out)
        check(out, reduce_ref(full, op, dtype, pre, post)[start:start + counts[rank]],
              "reducescatter of %d (op %d, post %g)" % (n, op, post))


def body():
    rank, size = capi.init()
    device = 0
    boundaries = boundaries_bytes()
    log("boundaries (bytes):", boundaries)
    for nbytes in boundaries:
        for n in counts_around(nbytes, 4):
            check_allreduce(rank, size, device, n, np.float32)
            if nbytes < 16 * MIB:  # the big one is about NCCL's kernel: allreduce covers it
                check_others(rank, size, device, n, np.float32)
        for dtype in (np.float16, np.float64):  # other pack sizes of the one-rank kernel
            check_allreduce(rank, size, device, counts_around(nbytes, np.dtype(dtype).itemsize)[2],
                            dtype)
    check_fused_pair(rank, size, device, int(os.environ.get("PERSEUS_FUSION_THRESHOLD", 64 * MIB)),
                     np.float32)
    capi.shutdown()
    stats = assert_fake_released()
    if os.environ["GPU_MODE"] == "nccl":
        assert stats["nccl_calls"] > 0, stats
    else:
        assert stats["nccl_calls"] == 0, stats


if __name__ == "__main__":
    main(body)
