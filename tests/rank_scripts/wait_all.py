"""Waiting for many handles in one call: perseus_wait_all (C API) and
requests.synchronize_all (DistributedOptimizer.synchronize() uses it).

perseus_wait_all: values of several requests (dtypes, shapes) against a reference
computed here; n = 0; bad arguments; an unknown handle (its index reported, the
others still valid); a timeout while a peer has not submitted (index of the first
pending handle, handles still valid); the first failure in list order (a mismatched
shape between two good requests) with its index and message, the later handle still
valid. synchronize_all: the same results as synchronize() one by one (in place,
out of place, grouped, allgather); a failure raises what synchronize() raises, on
every rank, and leaves later handles pending; unknown or repeated handles raise
ValueError before anything is consumed.
"""
import ctypes
import zlib

import torch

from common import expect_raises, hvd, init, main, touch, wait_for
from perseus.common import builder, ops, requests
from perseus.common import exceptions as ex
from perseus.common import library as lib

DTYPES = {torch.float32: ops.FLOAT32, torch.float64: ops.FLOAT64, torch.int32: ops.INT32}
SHAPES = [(7,), (3, 4), (2, 1, 5), ()]

_keep = []  # packed buffers and tensors outlive their requests


def enqueue(name, tensor):
    """One in-place Sum allreduce of `tensor`; returns its core handle."""
    spec = builder.Request(ops.ALLREDUCE, ops.GLOBAL_PROCESS_SET, DTYPES[tensor.dtype],
                           tuple(tensor.shape), tensor.data_ptr(), tensor.data_ptr(),
                           name=builder.wire_name(ops.ALLREDUCE, name), reduce_op=ops.Sum)
    handles, keep = requests.enqueue(builder.pack([spec]))
    _keep.append((keep, tensor))
    return handles[0]


def wait_all(handles, timeout_s=-1.0):
    """(status, index) of perseus_wait_all."""
    array = (ctypes.c_int64 * max(1, len(handles)))(*handles)
    index = ctypes.c_int32(-7)
    status = lib.perseus_wait_all(ctypes.addressof(array), len(handles), timeout_s,
                                  ctypes.byref(index))
    return status, index.value


def release(handles):
    for h in handles:
        lib.check(lib.perseus_release(h))


def value(tag, rank, shape, dtype):
    """This rank's input: small integers, exact in every dtype."""
    g = torch.Generator().manual_seed(zlib.crc32(("%s|%d" % (tag, rank)).encode()))
    return torch.randint(-20, 20, shape, generator=g).to(dtype)


def c_api(rank, size):
    # Values: every dtype x shape, in one wait.
    cases = [(dtype, shape) for dtype in DTYPES for shape in SHAPES]
    tensors = [value("c.%d" % i, rank, shape, dtype) for i, (dtype, shape) in enumerate(cases)]
    handles = [enqueue("wa.values.%d" % i, t) for i, t in enumerate(tensors)]
    status, index = wait_all(handles)
    assert (status, index) == (ex.SUCCESS, -1), (status, index, lib.perseus_last_error())
    for i, (t, (dtype, shape)) in enumerate(zip(tensors, cases)):
        expected = sum(value("c.%d" % i, r, shape, dtype).double() for r in range(size))
        assert torch.equal(t.double(), expected), (i, dtype, shape, t, expected)
    release(handles)

    # Nothing to wait for.
    assert wait_all([]) == (ex.SUCCESS, -1)

    # Bad arguments.
    status = lib.perseus_wait_all(None, -1, -1.0, ctypes.byref(ctypes.c_int32()))
    assert status == ex.INVALID_ARGUMENT, status
    one = (ctypes.c_int64 * 1)(1)
    assert lib.perseus_wait_all(ctypes.addressof(one), 1, -1.0, None) == ex.INVALID_ARGUMENT

    # An unknown handle: refused with its index; the good ones stay valid.
    t = torch.ones(3)
    good = enqueue("wa.unknown", t)
    status, index = wait_all([good, 10 ** 12])
    assert (status, index) == (ex.INVALID_ARGUMENT, 1), (status, index)
    assert "unknown" in lib.perseus_last_error().decode(), lib.perseus_last_error()
    assert wait_all([good]) == (ex.SUCCESS, -1)
    assert torch.equal(t, torch.full((3,), float(size)))
    release([good])

    # A timeout: rank 0 submits the second request only after the others timed out.
    early, late = torch.ones(2), torch.ones(4)
    h_early = enqueue("wa.early", early)
    if rank == 0:
        for r in range(1, size):
            wait_for("timed_out.%d" % r)
        h_late = enqueue("wa.late", late)
    else:
        h_late = enqueue("wa.late", late)
        assert wait_all([h_early]) == (ex.SUCCESS, -1)
        status, index = wait_all([h_early, h_late], 0.3)
        assert (status, index) == (ex.TIMEOUT, 1), (status, index, lib.perseus_last_error())
        touch("timed_out.%d" % rank)
    assert wait_all([h_early, h_late]) == (ex.SUCCESS, -1)
    assert torch.equal(late, torch.full((4,), float(size)))
    release([h_early, h_late])

    # The first failure in list order: the mismatch, between two good requests.
    ok, bad, after = torch.ones(2), torch.ones(2 + (rank == 0)), torch.ones(5)
    handles = [enqueue("wa.ok", ok), enqueue("wa.mismatch", bad), enqueue("wa.after", after)]
    status, index = wait_all(handles)
    assert (status, index) == (ex.MISMATCH, 1), (status, index)
    assert "wa.mismatch" in lib.perseus_last_error().decode(), lib.perseus_last_error()
    assert wait_all(handles[2:]) == (ex.SUCCESS, -1)
    assert torch.equal(after, torch.full((5,), float(size)))
    release(handles)


def python_api(rank, size):
    # The same results as synchronize() one by one.
    inputs = {dtype: [value("p.%s.%d" % (dtype, i), rank, shape, dtype)
                      for i, shape in enumerate(SHAPES)] for dtype in DTYPES}
    handles, checks = [], []
    for dtype, xs in inputs.items():
        d = str(dtype)[6:]
        expected = [sum(value("p.%s.%d" % (dtype, i), r, s, dtype) for r in range(size))
                    for i, s in enumerate(SHAPES)]
        mine = [x.clone() for x in xs]
        handles.append(hvd.allreduce_async_(mine[0], name="sa.inplace." + d, op=hvd.Sum))
        checks.append(lambda got, m=mine[0], e=expected[0]: got is m and torch.equal(m, e))
        handles.append(hvd.allreduce_async(xs[1], name="sa.out." + d, op=hvd.Sum))
        checks.append(lambda got, x=xs[1], e=expected[1]: got is not x and torch.equal(got, e))
        handles.append(hvd.grouped_allreduce_async(xs, name="sa.group." + d, op=hvd.Sum))
        checks.append(lambda got, e=expected: all(torch.equal(g, x) for g, x in zip(got, e)))
        handles.append(hvd.allgather_async(xs[2], name="sa.gather." + d))
        checks.append(lambda got, e=torch.cat([value("p.%s.2" % dtype, r, SHAPES[2], dtype)
                                               for r in range(size)]): torch.equal(got, e))
    results = requests.synchronize_all(handles)
    assert len(results) == len(handles)
    for i, (got, check) in enumerate(zip(results, checks)):
        assert check(got), "synchronize_all result %d is wrong: %r" % (i, got)
    assert requests.synchronize_all([]) == []

    # A failure: synchronize()'s exception on every rank; earlier handles consumed,
    # later ones pending.
    ok = hvd.allreduce_async(torch.ones(2), name="sa.ok", op=hvd.Sum)
    bad = hvd.allreduce_async(torch.ones(2 + (rank == 0)), name="sa.mismatch", op=hvd.Sum)
    later = hvd.allreduce_async(torch.ones(3), name="sa.later", op=hvd.Sum)
    e = expect_raises(hvd.HorovodInternalError, "synchronize_all mismatch",
                      requests.synchronize_all, [ok, bad, later], contains=["sa.mismatch"],
                      within_s=30)
    assert isinstance(e, RuntimeError)
    for gone in (ok, bad):
        expect_raises(ValueError, "a consumed handle", hvd.synchronize, gone,
                      contains=["unknown or already synchronized"])
    assert torch.equal(hvd.synchronize(later), torch.full((3,), float(size)))

    # Unknown or repeated handles: ValueError, nothing consumed.
    good = hvd.allreduce_async(torch.ones(2), name="sa.good", op=hvd.Sum)
    for what, handles in (("unknown", [good, 10 ** 12]), ("repeated", [good, good])):
        expect_raises(ValueError, what, requests.synchronize_all, handles,
                      contains=["unknown or already synchronized"])
    assert torch.equal(requests.synchronize_all([good])[0], torch.full((2,), float(size)))


def body():
    rank, size = init()
    c_api(rank, size)
    python_api(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
