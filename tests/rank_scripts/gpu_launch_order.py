"""Device lanes that cannot deadlock each other (issue 36): on the fake GPU whose device
model (tests/gpu_fakes/fake_device.c) gives each GPU FAKE_GPU_KERNEL_SLOTS=1 (an NCCL
kernel fills it until every peer has started the same kernel), steps of mixed batches
run on 4 lanes (PERSEUS_ALLREDUCE_STREAMS=4). Each step is one call of requests of
several dtypes and sizes, so the fusion planner makes several batches of one round,
one per lane; FAKE_GPU_LAUNCH_JITTER_US delays each launch by a different time on each
rank, so lanes finish their host work in different orders on different ranks. Unless
every rank launches its device collectives in one agreed order, two ranks launch two
lanes' kernels in opposite orders and the fake reports the wait-for cycle (the batch
fails naming it). Every result is checked against the sum computed here.
"""
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import capi  # noqa: E402
import fake_gpu  # noqa: E402
from capi import ALLREDUCE, BROADCAST  # noqa: E402
from rank_script import log, main  # noqa: E402

STEPS = int(os.environ.get("LAUNCH_ORDER_STEPS", "8"))
DTYPES = [np.float32, np.int32, np.float16, np.int64]


def step_plan(step):
    """The same requests on every rank: (kind, name, shape, dtype, root)."""
    rng = np.random.default_rng(zlib.crc32(b"launch-order|%d" % step))
    plan = []
    for i in range(int(rng.integers(5, 10))):
        size = int(rng.choice([1, 17, 700, 3000, 9000, 20000, 40000]))
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        kind = BROADCAST if rng.random() < 0.25 else ALLREDUCE
        plan.append((kind, "lo.%d.%d" % (step, i), (size,), dtype, int(rng.integers(0, 64))))
    return plan


def body():
    rank, size = capi.init()
    assert "PERSEUS_ALLREDUCE_STREAMS=4" in capi.config(), capi.config()
    for step in range(STEPS):
        plan = step_plan(step)
        requests, expected = [], []
        for kind, name, shape, dtype, root in plan:
            x = capi.make(name, rank, shape, dtype, low=-3, high=3)
            if kind == ALLREDUCE:
                want = sum(capi.make(name, r, shape, dtype, low=-3, high=3).astype(np.int64) for r in range(size))
                requests.append(capi.request(ALLREDUCE, name, x, device=0))
            else:
                want = capi.make(name, root % size, shape, dtype, low=-3, high=3)
                requests.append(capi.request(BROADCAST, name, x, device=0, root=root % size))
            expected.append(np.asarray(want).astype(dtype))
        for (_, name, _, _, _), pending, want in zip(plan, capi.submit(*requests), expected):
            out = pending.value()
            assert np.array_equal(out, want), "step %d, %s: got %r, expected %r" % (step, name, out[:8], want[:8])
    capi.shutdown()
    stats = fake_gpu.stats()
    log("fake GPU:", stats)
    assert stats["misuses"] == 0, stats
    assert stats["nccl_calls"] >= STEPS and stats["comms_created"] == 4, stats


if __name__ == "__main__":
    main(body)
