"""A CPU tensor on some ranks and a GPU tensor on others under one name is the
mismatch error on every rank, naming CPU vs GPU, like a dtype mismatch: for a new
name, and for a name every rank agreed on before (in the response cache). The odd
ranks use the GPU; no GPU is needed, since negotiation fails before any lane runs."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import capi  # noqa: E402
from support.rank_script import main  # noqa: E402


def expect_mismatch(rank, name):
    device = 0 if rank % 2 else capi.CPU
    x = np.ones((3,), dtype=np.float32)
    out = np.full_like(x, -1.0)
    status, message = capi.outcome(capi.ALLREDUCE, name, x, device=device, out=out)
    assert status == capi.MISMATCH, (status, message)
    assert "'%s'" % name in message and "device CPU vs GPU" in message, message
    assert np.all(out == -1.0)


def body():
    rank, size = capi.init()
    assert size >= 2
    expect_mismatch(rank, "fresh")
    # Agreed once on the CPU (cached), then one rank sends it from the GPU.
    for _ in range(2):
        out = capi.run(capi.ALLREDUCE, "cached", np.ones((3,), dtype=np.float32))
        assert np.all(out == size), out
    expect_mismatch(rank, "cached")
    out = capi.run(capi.ALLREDUCE, "cached", np.ones((3,), dtype=np.float32))
    assert np.all(out == size), out
    capi.shutdown()


if __name__ == "__main__":
    main(body)
