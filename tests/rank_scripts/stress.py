"""A mixed, gradient-like load run under different engine settings (lanes, fusion
threshold, cycle time; set by the test through the environment). Results must be
correct, and for the exactly representable inputs bit-identical to the reference, so
every setting gives identical answers.

Each iteration submits ~60 requests of mixed kinds, dtypes and sizes (some larger than
any small fusion threshold) asynchronously, reusing names across iterations (the
negotiation cache) while some names change shape or op between iterations; each rank
then waits on them in its own order. The test runs every setting in one process, each
run a fresh init() whose settings the script checks (common.check_engine_settings).
"""
import random

import torch

from common import (assert_equal, assert_reduced, check_engine_settings, dtype_name, hvd, init, main,
                    make_tensor, op_name)

ITERATIONS = 3
SIZES = [1, 7, 100, 1000, 5000, 70000, 200000]


def plan(iteration):
    """The requests of one iteration: (name, kind, dtype, shape, op, exact)."""
    requests = []
    for i, n in enumerate(SIZES):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.uint8):
            exact = dtype in (torch.float16, torch.bfloat16) or i % 2 == 0
            requests.append(("st.ar.%d.%s" % (i, dtype_name(dtype)), "allreduce", dtype, (n,), hvd.Sum, exact))
    # Names whose shape or op changes from one iteration to the next.
    requests.append(("st.reshaped", "allreduce", torch.float32, (10 + iteration, 3), hvd.Sum, True))
    requests.append(("st.reop", "allreduce", torch.int64, (50,), [hvd.Sum, hvd.Max, hvd.Min, hvd.Average][iteration % 4], True))
    requests.append(("st.avg", "allreduce", torch.float32, (4096,), hvd.Average, False))
    requests.append(("st.ag", "allgather", torch.float32, (3, 5), None, True))
    requests.append(("st.bc", "broadcast", torch.int64, (300,), None, True))
    requests.append(("st.ag.big", "allgather", torch.float64, (5000, 4), None, True))
    return requests


def body():
    rank, size = init()
    check_engine_settings()
    rng = random.Random(rank)  # each rank waits in its own order
    for it in range(ITERATIONS):
        handles = []
        for name, kind, dtype, shape, op, exact in plan(it):
            tag = "%s#%d" % (name, it)
            if kind == "allreduce":
                xs = [make_tensor(tag, r, shape, dtype, "exact" if exact else "sum") for r in range(size)]
                h = hvd.allreduce_async(xs[rank], name=name, op=op)
            elif kind == "allgather":  # rank r contributes (r + 1) * shape[0] rows
                xs = [make_tensor(tag, r, ((r + 1) * shape[0],) + shape[1:], dtype) for r in range(size)]
                h = hvd.allgather_async(xs[rank], name=name)
            else:
                xs = [make_tensor(tag, r, shape, dtype) for r in range(size)]
                h = hvd.broadcast_async(xs[rank], it % size, name=name)
            handles.append((h, name, kind, dtype, op, exact, xs, tag))
        rng.shuffle(handles)
        for h, name, kind, dtype, op, exact, xs, tag in handles:
            out = hvd.synchronize(h)
            what = "%s (%s, iteration %d)" % (name, op_name(op) if op is not None else kind, it)
            if kind == "allreduce":
                assert_reduced(out, xs, op, dtype, what, exact=exact)
            elif kind == "allgather":
                assert_equal(out, torch.cat(xs), what)
            else:
                assert_equal(out, xs[it % size], what)
    hvd.shutdown()


main(body)
