"""How many CUDA calls the GPU path makes, counted by the fake (tests/gpu_fakes): the
host cost of a GPU tensor is mostly these calls (each 1-5 µs on a real GPU).

  * requests enqueued together on one stream share one ready event;
  * a device lane waits once per producer stream per batch (the event recorded last
    there covers the earlier ones), not once per request;
  * perseus_stream_wait_all makes the consumer wait once per batch, not per request.
Results are checked too. Environment: FAKE_GPU_LIB; GPU_MODE = nccl.
"""
import array
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import capi  # noqa: E402
from support import fake_gpu  # noqa: E402
from gpu_collectives import assert_fake_released, reduce_ref, same  # noqa: E402
from perseus.common import library as lib  # noqa: E402
from support.rank_script import main  # noqa: E402

N = 12


def counted(submit_all, expect, what):
    """Runs submit_all() -> [(Pending, inputs)], waits for all, makes the legacy stream
    wait for all in one call, and checks the calls made against `expect`."""
    before = fake_gpu.calls()
    pending = submit_all()
    handles = array.array("q", [p.handle for p, _ in pending])
    index = ctypes.c_int32()
    capi.check(lib.perseus_wait_all(handles.buffer_info()[0], len(handles), 60.0, ctypes.byref(index)))
    capi.check(lib.perseus_stream_wait_all(handles.buffer_info()[0], len(handles), None))
    after = fake_gpu.calls()
    made = {k: after[k] - before[k] for k in expect}
    assert made == expect, "%s: calls %s, expected %s" % (what, made, expect)
    for p, xs in pending:
        same(p.value(), reduce_ref(xs, capi.SUM, np.float32), what)


def inputs(tag, rank, size):
    return [[capi.make("%s.%d" % (tag, i), r, (33 + i,), np.float32) for r in range(size)]
            for i in range(N)]


def body():
    rank, size = capi.init()
    capi.run(capi.ALLREDUCE, "warm", np.ones(4, np.float32), device=0)  # opens the lane
    other = fake_gpu.new_stream(0, "other")

    # One enqueue of N requests on one stream: one ready event, one batch.
    xs = inputs("one", rank, size)
    counted(lambda: list(zip(capi.submit(*[capi.request(capi.ALLREDUCE, "one.%d" % i, x[rank], device=0)
                                           for i, x in enumerate(xs)]), xs)),
            {"event_records": 2, "stream_waits": 2}, "one enqueue")  # ready + done; lane + consumer

    # N enqueues on one stream, held into one round: N ready events, still one lane wait.
    xs = inputs("many", rank, size)
    counted(lambda: [(capi.submit(capi.request(capi.ALLREDUCE, "many.%d" % i, x[rank], device=0))[0], x)
                     for i, x in enumerate(xs)],
            {"event_records": N + 1, "stream_waits": 2}, "one enqueue per request")

    # Two producer streams in one round: one lane wait per stream.
    xs = inputs("two", rank, size)
    counted(lambda: [(capi.submit(capi.request(capi.ALLREDUCE, "two.%d" % i, x[rank], device=0,
                                               stream=other if i % 2 else None, consumer=None))[0], x)
                     for i, x in enumerate(xs)],
            {"event_records": N + 1, "stream_waits": 3}, "two producer streams")

    fake_gpu.destroy_stream(0, other)
    capi.shutdown()
    assert_fake_released()


if __name__ == "__main__":
    main(body)
