"""Every collective on GPU tensors through the device lanes, on the fake CUDA runtime
and NCCL of tests/gpu_fakes (device memory is host memory; NCCL runs over MPI), so
the lanes' logic — opening with the set, packing into the fusion buffer, offsets,
uneven splits, scale factors, the host-staged copies, core-allocated outputs,
completion events, freeing everything at shutdown — is checked against numpy on a
machine without a GPU. Inputs are small integers, so every expected value is exact.

Environment: FAKE_GPU_LIB (the fake, to read its counters); GPU_MODE = nccl (every
NCCL-expressible batch must use NCCL) or staged (none may); PERSEUS_* as the test sets.
"""
import functools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import capi  # noqa: E402
from support import fake_gpu  # noqa: E402
from support.capi import ALLREDUCE, ALLGATHER, ALLTOALL, BFLOAT16, BROADCAST, REDUCESCATTER  # noqa: E402
from support.rank_script import log, main  # noqa: E402

DTYPES = [np.uint8, np.int8, np.int32, np.int64, np.float16, BFLOAT16, np.float32, np.float64]
OPS = [capi.SUM, capi.AVERAGE, capi.MIN, capi.MAX, capi.PRODUCT]
SHAPES = [(), (17,), (3, 4), (0,), (1 << 12,)]


def fake_stats():
    return fake_gpu.stats()


def assert_fake_released():
    """After shutdown: no misuse of the fake GPU (races included), and nothing of it
    left allocated."""
    stats = fake_stats()
    log("fake GPU after shutdown:", stats)
    assert stats["misuses"] == 0, stats
    for key in ("device_buffers", "pinned_buffers", "streams", "comms"):
        assert stats[key] == 0, "%s left after shutdown: %s" % (key, stats)
    return stats


def as_float(x, dtype):
    return capi.from_bf16(x).astype(np.float64) if dtype == BFLOAT16 else x.astype(np.float64)


def back(values, dtype):
    return capi.to_bf16(values) if dtype == BFLOAT16 else values.astype(dtype)


def reduce_ref(xs, op, dtype, pre=1.0, post=1.0):
    """The MPI path's semantics: ints scaled with truncation toward zero."""
    integer = dtype != BFLOAT16 and np.issubdtype(np.dtype(dtype), np.integer)
    if integer:
        v = np.stack([x.astype(np.int64) for x in xs])
        v = np.trunc(v * pre).astype(np.int64) if pre != 1.0 else v
    else:
        v = np.stack([as_float(x, dtype) for x in xs]) * pre
    n = len(xs)
    if op in (capi.SUM, capi.AVERAGE):
        r = v.sum(0)
    elif op == capi.MIN:
        r = v.min(0)
    elif op == capi.MAX:
        r = v.max(0)
    else:
        r = v.prod(0)
    factor = post / n if op == capi.AVERAGE else post
    if factor != 1.0:
        r = np.trunc(r * factor).astype(np.int64) if integer else r * factor
    return back(np.asarray(r), dtype)


def same(out, expected, what):
    assert out.shape == expected.shape and np.array_equal(out, expected), \
        "%s:\n got %r\n expected %r" % (what, out, expected)


def check_allreduce(rank, size, device):
    # One request at a time: straight from the input into the output.
    for dtype in DTYPES:
        for op in OPS:
            low, high = (-2, 2) if op == capi.PRODUCT else (-8, 8)
            for i, shape in enumerate(SHAPES):
                tag = "ar.%s.%d.%d" % (dtype if dtype == BFLOAT16 else np.dtype(dtype).name, op, i)
                xs = [capi.make(tag, r, shape, dtype, low, high) for r in range(size)]
                out = capi.run(ALLREDUCE, tag, xs[rank], device=device, reduce_op=op, dtype=dtype)
                same(out, reduce_ref(xs, op, dtype), tag)
    # Several at once: fused into one buffer (a joined-free batch), several dtypes.
    for dtype in DTYPES:
        tags = ["fused.%s.%d" % (dtype, k) for k in range(4)]
        shapes = [(5,), (2, 3), (), (33,)]
        xs = {t: [capi.make(t, r, s, dtype) for r in range(size)] for t, s in zip(tags, shapes)}
        pend = capi.submit(*[capi.request(ALLREDUCE, t, xs[t][rank], device=device, dtype=dtype)
                             for t in tags])
        for t, p in zip(tags, pend):
            same(p.value(), reduce_ref(xs[t], capi.SUM, dtype), t)
    # In place.
    x = capi.make("inplace", rank, (9,), np.float32)
    expected = reduce_ref([capi.make("inplace", r, (9,), np.float32) for r in range(size)],
                          capi.SUM, np.float32)
    capi.run(ALLREDUCE, "inplace", x, out=x, device=device)
    same(x, expected, "in place")


def check_scaled(rank, size, device):
    cases = [  # (dtype, op, pre, post): NCCL folds Sum/Average scales; the rest is staged
        (np.float32, capi.SUM, 2.0, 0.25), (np.float16, capi.AVERAGE, 3.0, 0.5),
        (BFLOAT16, capi.SUM, 0.5, 2.0), (np.float64, capi.AVERAGE, 1.0, 4.0),
        (np.float32, capi.MIN, -1.0, 1.0), (np.float64, capi.MAX, 1.0, 2.0),
        (np.int32, capi.SUM, 3.0, 2.0), (np.int64, capi.AVERAGE, 2.0, 1.0),
    ]
    for k, (dtype, op, pre, post) in enumerate(cases):
        tag = "scaled.%d" % k
        xs = [capi.make(tag, r, (6,), dtype) for r in range(size)]
        for fused in (False, True):
            name = tag + (".fused" if fused else "")
            reqs = [capi.request(ALLREDUCE, name, xs[rank], device=device, reduce_op=op,
                                 prescale=pre, postscale=post, dtype=dtype)]
            if fused:
                reqs.append(capi.request(ALLREDUCE, name + ".b", xs[rank], device=device,
                                         reduce_op=op, prescale=pre, postscale=post, dtype=dtype))
            for p in capi.submit(*reqs):
                same(p.value(), reduce_ref(xs, op, dtype, pre, post), name)
    # int16 has no NCCL type: staged.
    xs = [capi.make("int16", r, (7,), np.int16) for r in range(size)]
    same(capi.run(ALLREDUCE, "int16", xs[rank], device=device), reduce_ref(xs, capi.SUM, np.int16),
         "int16")
    # Bitwise ops: staged (NCCL has none), integers only and never scaled.
    for op, fold in ((capi.BAND, np.bitwise_and), (capi.BOR, np.bitwise_or),
                     (capi.BXOR, np.bitwise_xor)):
        for dtype in (np.uint8, np.int16, np.int64):
            tag = "bitwise.%d.%s" % (op, np.dtype(dtype).name)
            xs = [capi.make(tag, r, (2, 9), dtype, -100, 100) for r in range(size)]
            out = capi.run(ALLREDUCE, tag, xs[rank], device=device, reduce_op=op)
            same(out, functools.reduce(fold, xs), tag)
        for what, kwargs, expected in (
                ("a float", dict(x=np.ones(3, np.float32)), "needs an integer tensor"),
                ("a scale", dict(x=np.ones(3, np.int32), prescale=2.0), "takes no scale factors")):
            try:
                capi.run(ALLREDUCE, "bitwise.refused", device=device, reduce_op=op, **kwargs)
                raise AssertionError("bitwise op %d with %s was accepted" % (op, what))
            except capi.CoreError as e:
                assert e.status == capi.INVALID_ARGUMENT and expected in e.message, e
    # Adasum: staged, the same bits as the MPI path on host copies.
    x = capi.make("adasum", rank, (10,), np.float32)
    gpu = capi.run(ALLREDUCE, "adasum.gpu", x, device=device, reduce_op=capi.ADASUM)
    cpu = capi.run(ALLREDUCE, "adasum.cpu", x, reduce_op=capi.ADASUM)
    same(gpu, cpu, "adasum")


def check_broadcast(rank, size, device):
    root = size - 1
    for dtype in (np.float32, np.int8, BFLOAT16):
        x = capi.make("bc.%s" % dtype, rank, (3, 5), dtype)
        out = capi.run(BROADCAST, "bc.%s" % dtype, x, device=device, root=root, dtype=dtype)
        same(out, capi.make("bc.%s" % dtype, root, (3, 5), dtype), "broadcast")
    # Fused across dtypes (bytes), and in place on the root.
    specs = [("bcf.a", np.float64, (4,)), ("bcf.b", np.int8, (3,)), ("bcf.c", np.bool_, (5,)),
             ("bcf.d", np.int16, (2, 2))]
    xs = [capi.make(t, rank, s, d, 0, 1).astype(d) for t, d, s in specs]
    reqs = [capi.request(BROADCAST, t, x, device=device, root=root,
                         out=x if rank == root and t == "bcf.a" else None)
            for (t, d, s), x in zip(specs, xs)]
    for (t, d, s), p in zip(specs, capi.submit(*reqs)):
        same(p.value(), capi.make(t, root, s, d, 0, 1).astype(d), t)


def check_allgather(rank, size, device):
    for tag, rows_of, dtype in [("ag.uneven", lambda r: r + 1, np.float32),
                                ("ag.even", lambda r: 2, np.int64),
                                ("ag.bool", lambda r: r % 2, np.bool_),
                                ("ag.none", lambda r: 0, np.float16)]:
        xs = [capi.make(tag, r, (rows_of(r), 3), dtype, 0, 1).astype(dtype) for r in range(size)]
        out = capi.run(ALLGATHER, tag, xs[rank], device=device)
        same(out, np.concatenate(xs), tag)


def check_alltoall(rank, size, device):
    def splits_of(r):
        return [(r + j) % 3 for j in range(size)]

    xs = [capi.make("a2a", r, (sum(splits_of(r)), 2), np.float32) for r in range(size)]
    out, recv = capi.run(ALLTOALL, "a2a", xs[rank], device=device, splits=splits_of(rank))
    pieces = []
    for r in range(size):
        start = sum(splits_of(r)[:rank])
        pieces.append(xs[r][start:start + splits_of(r)[rank]])
    assert recv == [splits_of(r)[rank] for r in range(size)], recv
    same(out, np.concatenate(pieces), "alltoall")


def check_reducescatter(rank, size, device):
    for rows in (2 * size, size + 1, 1):
        for dtype, op in ((np.float32, capi.SUM), (np.float64, capi.AVERAGE), (np.int32, capi.SUM),
                          (np.float32, capi.MAX)):
            tag = "rs.%d.%s.%d" % (rows, np.dtype(dtype).name, op)
            xs = [capi.make(tag, r, (rows, 3), dtype) for r in range(size)]
            counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
            start = sum(counts[:rank])
            out = np.full((counts[rank], 3), 99, dtype=dtype)
            capi.run(REDUCESCATTER, tag, xs[rank], device=device, reduce_op=op, out=out)
            same(out, reduce_ref(xs, op, dtype)[start:start + counts[rank]], tag)


def check_join(rank, size, device):
    """Rank 0 reduces a GPU tensor while the others have joined: they add zeros."""
    if size < 2:
        return
    x = capi.make("joined", rank, (6,), np.float32)
    if rank == 0:
        out = capi.run(ALLREDUCE, "joined", x, device=device)
        same(out, x, "allreduce with joined ranks")
    last = capi.submit(capi.request(capi.JOIN, "join"))[0]
    status, message = last.wait()
    last.release()
    assert status == 0, message


def check_process_set(rank, size, device):
    """A set of the first and last ranks: its own device lanes and NCCL communicators."""
    if size < 3:
        return
    members = [0, size - 1]
    set_id = capi.add_process_set(members)
    if rank in members:
        xs = [capi.make("set.ar", r, (8,), np.float32) for r in members]
        out = capi.run(ALLREDUCE, "set.ar", xs[members.index(rank)], device=device,
                       process_set=set_id)
        same(out, reduce_ref(xs, capi.SUM, np.float32), "allreduce on a process set")
        ys = [capi.make("set.ag", r, (members.index(r) + 1, 2), np.int32) for r in members]
        out = capi.run(ALLGATHER, "set.ag", ys[members.index(rank)], device=device,
                       process_set=set_id)
        same(out, np.concatenate(ys), "allgather on a process set")
    # Everyone passes the same point before the set goes (it is collective).
    capi.run(ALLREDUCE, "set.done", np.ones(1, np.float32))
    capi.remove_process_set(set_id)


def body():
    rank, size = capi.init()
    devices = int(os.environ.get("FAKE_CUDA_DEVICES", "1"))
    device = rank % devices  # ordinals may differ across ranks
    check_allreduce(rank, size, device)
    check_scaled(rank, size, device)
    check_broadcast(rank, size, device)
    check_allgather(rank, size, device)
    check_alltoall(rank, size, device)
    check_reducescatter(rank, size, device)
    check_join(rank, size, device)
    check_process_set(rank, size, device)
    # CPU work is unaffected.
    out = capi.run(ALLREDUCE, "cpu", np.ones(3, dtype=np.float32))
    same(out, np.full(3, size, dtype=np.float32), "cpu")
    capi.shutdown()

    stats = assert_fake_released()
    mode = os.environ["GPU_MODE"]
    if mode == "nccl":
        assert stats["nccl_calls"] > 0 and stats["comms_created"] > 0, stats
    else:
        assert stats["nccl_calls"] == 0 and stats["comms_created"] == 0, stats

    # init() after shutdown(): new lanes, new communicators.
    capi.init()
    x = capi.make("again", rank, (4,), np.float32)
    out = capi.run(ALLREDUCE, "again", x, device=device)
    same(out, reduce_ref([capi.make("again", r, (4,), np.float32) for r in range(size)],
                         capi.SUM, np.float32), "after re-init")
    capi.shutdown()
    stats = fake_stats()
    assert stats["misuses"] == 0 and stats["streams"] == 0 and stats["comms"] == 0, stats


if __name__ == "__main__":
    main(body)
