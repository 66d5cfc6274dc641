"""Rounds that carry a repeated small allreduce's data (csrc/src/engine/round_payload.h):
the results of a loop of one named call, against a reference computed here from every
rank's input, and the core's counters saying which calls a round completed.

1. Each dtype and op (Sum, Average, Min, Max, Product; prescale and postscale; BAND,
   BOR and BXOR of integers, which only torch.distributed's faces pass, called here
   through the operations layer), shapes of 1 element to 16 KiB: every call's result
   right; from the third call on each is completed by its round (ridden_requests),
   with no data collective.
2. A payload larger than 16 KiB is never carried.
3. Two names in turn (A, B, A, B): no round carries either (each would miss).
4. One rank submits another request before one call of a loop, the others after it:
   the round it runs carries the loop's payload without it (a miss), so that call is
   reduced the usual way, right, and the loop rides again.
5. A non-contiguous result target (out of place: hvd.allreduce returns a new tensor).
"""
import functools

import torch

from common import hvd, init, main
from perseus.common import ops as _ops
from perseus.common import requests as _requests
from perseus.torch import ops as _tops

RIDE_LIMIT_BYTES = 16 << 10
OPS = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max,
       "product": hvd.Product, "band": _ops.BAND, "bor": _ops.BOR, "bxor": _ops.BXOR}
BITWISE = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}


def reference(inputs, op, prescale, postscale):
    if op in BITWISE:
        return functools.reduce(BITWISE[op], inputs)
    stack = torch.stack([x.double() * prescale for x in inputs])
    result = {"sum": stack.sum(0), "average": stack.mean(0), "min": stack.min(0)[0],
              "max": stack.max(0)[0], "product": stack.prod(0)}[op]
    return result * postscale


def inputs_for(rank_count, shape, dtype, step):
    base = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    # Small integers, exact in every dtype here and in any order of reduction.
    return [((base + 3 * k + step) % 5 + 1).to(dtype) for k in range(rank_count)]


def check(got, expected, dtype, what):
    expected = expected.to(got.dtype) if not got.dtype.is_floating_point else expected
    tol = 0.02 if dtype in (torch.float16, torch.bfloat16) else 1e-9
    diff = (got.double() - expected.double()).abs()
    assert bool((diff <= tol * expected.double().abs() + tol).all()), \
        "%s: got %s, expected %s" % (what, got.flatten()[:6].tolist(), expected.flatten()[:6].tolist())


def interloper(rank, size):
    """Submits another request; returns a function that waits for it and checks it."""
    inputs = inputs_for(size, (8,), torch.float64, 0)
    t = inputs[rank].clone()
    handle = hvd.allreduce_async_(t, name="ride.interloper", op=hvd.Max)

    def finish():
        hvd.synchronize(handle)
        check(t, reference(inputs, "max", 1.0, 1.0), torch.float64, "the interloper")
    return finish


def loop(name, shape, dtype, op, rank, size, calls=6, prescale=1.0, postscale=1.0, miss_at=None):
    """`calls` calls of one named allreduce_; each checked. Returns the counters' change.
    miss_at: the step before which the last rank submits another request (the others
    after it)."""
    before = _requests.counters()
    for step in range(calls):
        if step == miss_at and rank == size - 1:
            finish = interloper(rank, size)
        inputs = inputs_for(size, shape, dtype, step)
        t = inputs[rank].clone()
        if op in BITWISE:
            _tops.allreduce_now_(t, hvd.global_process_set, OPS[op], name)
        else:
            hvd.allreduce_(t, name=name, op=OPS[op], prescale_factor=prescale,
                           postscale_factor=postscale)
        check(t, reference(inputs, op, prescale, postscale), dtype,
              "%s step %d (%s, %s, %s)" % (name, step, dtype, op, shape))
        if step == miss_at:
            (finish if rank == size - 1 else interloper(rank, size))()
    after = _requests.counters()
    return {k: after[k] - before[k] for k in after}


def body():
    rank, size = init()
    cases = 0
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64, torch.uint8, torch.int8):
        for op in OPS:
            if (op == "average" and not dtype.is_floating_point or
                    op in BITWISE and dtype.is_floating_point):
                continue
            if op == "product" and dtype in (torch.uint8, torch.int8) and size > 2:
                continue  # 5**4 overflows 8 bits
            for shape in ((1,), (3, 5), (4096 // dtype.itemsize,)):
                scales = (0.5, 2.0) if dtype.is_floating_point and op == "sum" else (1.0, 1.0)
                counts = loop("ride.%s.%s.%s" % (dtype, op, shape), shape, dtype, op, rank, size,
                              prescale=scales[0], postscale=scales[1])
                # Call 1 is new (gathered), call 2 the first repeat; calls 3-6 ride.
                assert counts["ridden_requests"] == 4, (dtype, op, shape, counts)
                assert counts["data_collectives"] == 2, (dtype, op, shape, counts)
                cases += 1
    big = loop("ride.big", ((RIDE_LIMIT_BYTES // 4) + 1,), torch.float32, "sum", rank, size)
    # (Its first round may still carry the last loop's payload, and miss.)
    assert big["payload_rounds"] <= 1 and big["ridden_requests"] == 0, big
    assert big["data_collectives"] == 6, big
    at_limit = loop("ride.limit", (RIDE_LIMIT_BYTES // 4,), torch.float32, "sum", rank, size)
    assert at_limit["ridden_requests"] == 4, at_limit

    before = _requests.counters()
    for step in range(8):
        for name in ("turn.a", "turn.b"):
            inputs = inputs_for(size, (64,), torch.float32, step)
            t = inputs[rank].clone()
            hvd.allreduce_(t, name=name, op=hvd.Sum)
            check(t, reference(inputs, "sum", 1.0, 1.0), torch.float32, name)
    after = _requests.counters()
    assert after["payload_rounds"] - before["payload_rounds"] <= 1, "A, B in turn carried payloads"

    missed = loop("ride.miss", (256,), torch.float32, "sum", rank, size, calls=10, miss_at=5)
    # Steps 2-4 ride; 5 misses, and the interloper breaks the run of lone agreements.
    assert 4 <= missed["ridden_requests"] <= 7 and missed["data_collectives"] >= 4, missed

    out_of_place = []
    for step in range(5):
        inputs = inputs_for(size, (32,), torch.float64, step)
        out_of_place.append(hvd.allreduce(inputs[rank], name="ride.copy", op=hvd.Sum))
        check(out_of_place[-1], reference(inputs, "sum", 1.0, 1.0), torch.float64, "out of place")
        assert torch.equal(inputs[rank], inputs_for(size, (32,), torch.float64, step)[rank]), \
            "the input of an out-of-place allreduce changed"
    print("[rank %d] %d cases" % (rank, cases), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
