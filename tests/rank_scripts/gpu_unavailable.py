"""GPU requests on a machine where CUDA cannot be used (no driver, no device, or no
runtime at all), through the C ABI with a host pointer standing for device memory:
every rank gets the same clear error (no hang, the pointer never touched), and the
engine keeps serving CPU requests correctly, before and after.

GPU_EXPECT (optional): a text every rank's message must contain."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import capi  # noqa: E402
from support.rank_script import log, main  # noqa: E402


def cpu_round(rank, size, tag):
    x = capi.make(tag, rank, (5, 3), np.float32)
    out = capi.run(capi.ALLREDUCE, tag, x)
    expected = sum(capi.make(tag, r, (5, 3), np.float32) for r in range(size))
    assert np.array_equal(out, expected), (out, expected)


def gpu_fails(rank, size, name, op_type=capi.ALLREDUCE, **kwargs):
    # Poisoned host memory: a path that wrongly touched it would show.
    x = np.full((4, 2), 7.0, dtype=np.float32)
    out = np.full_like(x, -1.0)
    status, message = capi.outcome(op_type, name, x, device=0, out=out, **kwargs)
    assert status == capi.UNSUPPORTED, (status, message)
    assert "GPU tensor '%s'" % name in message, message
    for r in range(size):  # every rank's reason is named
        assert "rank %d: " % r in message, message
    expect = os.environ.get("GPU_EXPECT")
    assert expect is None or expect in message, (expect, message)
    assert np.all(out == -1.0) and np.all(x == 7.0), "the buffers were touched"
    return message


def body():
    rank, size = capi.init()
    cpu_round(rank, size, "before")
    message = gpu_fails(rank, size, "gpu.first")
    log("GPU request failed as expected:", message)
    cpu_round(rank, size, "between")
    # Again, and a broadcast: the lanes retry opening on every rank, fail the same way.
    gpu_fails(rank, size, "gpu.second")
    gpu_fails(rank, size, "gpu.bcast", op_type=capi.BROADCAST, root=size - 1)
    cpu_round(rank, size, "after")
    capi.shutdown()
    # init() after shutdown() works, and GPU requests still fail cleanly.
    capi.init()
    gpu_fails(rank, size, "gpu.reinit")
    cpu_round(rank, size, "reinit")
    capi.shutdown()


if __name__ == "__main__":
    main(body)
