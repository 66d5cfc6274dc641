"""Stream ordering of the device lanes, on the fake CUDA runtime and its ordering
checker (tests/gpu_fakes/fake_order.c): the C ABI counterpart of gpu_torch_ordering.py.

Every input is written by a framework kernel on a producer stream just before enqueue,
and every result is read by a kernel on a consumer stream after perseus_stream_wait
(capi does both). The checker fails a request at once, naming both operations, when
the lane reads an input without waiting for its producer, or the consumer reads a
result without waiting for the lane. Streams: the legacy one; one side stream for
both; a producer and a different consumer. Many requests are in flight at once, and
core-allocated outputs are freed on the consumer stream and their memory reused.

Environment: FAKE_GPU_LIB; GPU_MODE = nccl or staged; PERSEUS_* as the test sets.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import capi  # noqa: E402
from support import fake_gpu  # noqa: E402
from support.capi import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCESCATTER  # noqa: E402
from gpu_collectives import assert_fake_released, reduce_ref, same  # noqa: E402
from support.rank_script import log, main  # noqa: E402


def run(rank, size, device, streams, tag):
    io = dict(device=device, stream=streams[0], consumer=streams[1])

    def make(name, shape, dtype=np.float32):
        return [capi.make(tag + name, r, shape, dtype) for r in range(size)]

    xs = make(".ar", (1001,))
    same(capi.run(ALLREDUCE, tag + ".ar", xs[rank], postscale=3.0, **io),
         reduce_ref(xs, capi.SUM, np.float32, post=3.0), tag + " allreduce")
    x = xs[rank].copy()
    capi.run(ALLREDUCE, tag + ".ar_", x, out=x, reduce_op=capi.AVERAGE, **io)
    same(x, reduce_ref(xs, capi.AVERAGE, np.float32), tag + " allreduce in place")

    # Many in flight, some fused with each other, collected in reverse order.
    inputs = [make(".many%d" % i, (257 + 31 * i,)) for i in range(12)]
    pending = [capi.submit(capi.request(ALLREDUCE, "%s.many%d" % (tag, i), ys[rank], **io))[0]
               for i, ys in enumerate(inputs)]
    for i in reversed(range(12)):
        same(pending[i].value(), reduce_ref(inputs[i], capi.SUM, np.float32), "%s many #%d" % (tag, i))
    grouped = [make(".g%d" % i, (40 + i,)) for i in range(5)]
    pending = capi.submit(*[capi.request(ALLREDUCE, "%s.g%d" % (tag, i), ys[rank], **io)
                            for i, ys in enumerate(grouped)])
    for i, p in enumerate(pending):
        same(p.value(), reduce_ref(grouped[i], capi.SUM, np.float32), "%s grouped #%d" % (tag, i))

    root = size - 1
    xs = make(".bc", (3, 7))
    same(capi.run(BROADCAST, tag + ".bc", xs[rank], root=root, **io), xs[root], tag + " broadcast")
    xs = [capi.make(tag + ".ag", r, (r + 2, 3), np.float32) for r in range(size)]
    same(capi.run(ALLGATHER, tag + ".ag", xs[rank], **io), np.concatenate(xs), tag + " allgather")
    xs = make(".a2a", (size * 2, 3))
    out, _ = capi.run(ALLTOALL, tag + ".a2a", xs[rank], **io)
    same(out, np.concatenate([xs[r][2 * rank:2 * rank + 2] for r in range(size)]), tag + " alltoall")
    xs = make(".rs", (size * 3, 2))
    out = np.zeros((3, 2), np.float32)
    capi.run(REDUCESCATTER, tag + ".rs", xs[rank], out=out, **io)
    same(out, reduce_ref(xs, capi.SUM, np.float32)[3 * rank:3 * rank + 3], tag + " reducescatter")

    # Core-allocated outputs, freed stream-ordered on the consumer, their memory reused.
    for i in range(30):
        xs = [np.full(512 + i, float(r + i), np.float32) for r in range(size)]
        same(capi.run(ALLGATHER, "%s.free%d" % (tag, i), xs[rank], **io), np.concatenate(xs),
             "%s reused output #%d" % (tag, i))


def body():
    rank, size = capi.init()
    device = 0
    side = fake_gpu.new_stream(device, "side")
    producer = fake_gpu.new_stream(device, "producer")
    consumer = fake_gpu.new_stream(device, "consumer")
    for streams, tag in (((None, None), "legacy"), ((side, side), "side"),
                         ((producer, consumer), "producer-consumer")):
        log("streams:", tag)
        run(rank, size, device, streams, tag)
    for stream in (side, producer, consumer):
        fake_gpu.destroy_stream(device, stream)
    capi.shutdown()
    assert_fake_released()


if __name__ == "__main__":
    main(body)
