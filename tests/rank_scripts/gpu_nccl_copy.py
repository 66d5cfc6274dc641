"""Perseus takes every NCCL function from the library it loaded (issue 36): torch's own
NCCL (2.28.9) is global in a process before Perseus loads another one by path
(PERSEUS_NCCL_LIB, e.g. NCCL 2.32.3 for several ranks on one GPU). Here that other NCCL
is tests/gpu_fakes/fake_other_nccl.c, loaded global first (OTHER_NCCL); Perseus loads
NCCL_COPY, a separate copy of the fake. Every call must reach NCCL_COPY: Perseus's own,
and NCCL_COPY's calls to its own exported functions (the fake checks that they stay in
it, which needs RTLD_DEEPBIND with another copy global). Results are checked against
the sums computed here.
"""
import ctypes
import os
import sys

import numpy as np

OTHER = ctypes.CDLL(os.environ["OTHER_NCCL"], mode=ctypes.RTLD_GLOBAL)  # before Perseus, as torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import capi  # noqa: E402
from support import fake_gpu  # noqa: E402
from perseus.common import library as lib  # noqa: E402
from support.rank_script import log, main  # noqa: E402


def body():
    rank, size = capi.init()
    for i, shape in enumerate([(5,), (3000,), (1 << 15,)]):
        xs = [capi.make("copy.%d" % i, r, shape, np.float32) for r in range(size)]
        out = capi.run(capi.ALLREDUCE, "copy.%d" % i, xs[rank], device=0)
        assert np.array_equal(out, sum(xs)), "allreduce %d wrong" % i
    described = lib.perseus_gpu_describe().decode()
    log(described)
    assert "NCCL: %s (version 2.32.3)" % os.environ["PERSEUS_NCCL_LIB"] in described, described
    capi.shutdown()
    loaded = ctypes.CDLL(os.environ["PERSEUS_NCCL_LIB"])  # the copy Perseus loaded (the same handle)
    loaded.fake_gpu_last_misuse.restype = ctypes.c_char_p
    stats = (ctypes.c_long * len(fake_gpu.STAT_KEYS))()
    loaded.fake_gpu_stats(stats)
    stats = dict(zip(fake_gpu.STAT_KEYS, stats))
    log("the NCCL Perseus loaded:", stats)
    assert stats["misuses"] == 0, loaded.fake_gpu_last_misuse().decode()
    assert stats["nccl_calls"] >= 3 and stats["comms_created"] >= 1, stats
    OTHER.other_nccl_calls.restype = ctypes.c_long
    assert OTHER.other_nccl_calls() == 0, "%d call(s) reached the other NCCL" % OTHER.other_nccl_calls()


if __name__ == "__main__":
    main(body)
