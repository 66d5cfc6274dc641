"""Configuration that differs between ranks fails init() on every rank with the same
clear error, never a hang: a bad value on one rank only, and valid values that would
make ranks plan different collectives. Afterwards a consistent setting works."""
import os

import torch

from common import expect_raises, hvd, launcher_rank_size, main


def init_with(env):
    os.environ.update(env)
    try:
        hvd.init()
    finally:
        for key in env:
            del os.environ[key]


def body():
    rank, size = launcher_rank_size()
    last = size - 1

    # A value only the last rank gets wrong: every rank hears about it.
    bad = {"PERSEUS_ALLREDUCE_STREAMS": "two"} if rank == last else {}
    expect_raises(ValueError, "bad value on rank %d" % last, init_with, bad,
                  contains=("rank %d" % last, "PERSEUS_ALLREDUCE_STREAMS", "'two'"), within_s=30)
    assert not hvd.is_initialized()

    # Valid values that differ: fusion plans would differ, so init refuses on every rank.
    differing = {"PERSEUS_FUSION_THRESHOLD": str((rank + 1) << 20)}
    expect_raises(ValueError, "thresholds differ", init_with, differing,
                  contains=("PERSEUS_FUSION_THRESHOLD", "differs across ranks"), within_s=30)
    assert not hvd.is_initialized()

    # Every setting that changes what goes on the wire (or when) is compared, whatever
    # its type; the error names the variable and the ranks' values.
    for variable, value_of in (("PERSEUS_ALLREDUCE_NANCHECK", lambda r: "1" if r == last else "0"),
                               ("PERSEUS_HOLD_TIME", lambda r: "100.5" if r == last else "100"),
                               ("PERSEUS_RANKS_PER_NODE", lambda r: "2" if r == last else "")):
        shown = [value_of(r) or "unset" for r in (0, last)]
        expect_raises(ValueError, variable + " differs", init_with, {variable: value_of(rank)},
                      contains=(variable, "differs across ranks", "rank 0: %s," % shown[0],
                                "rank %d: %s)" % (last, shown[1])), within_s=30)
        assert not hvd.is_initialized()

    # The same values everywhere: works, and computes the right thing.
    init_with({"PERSEUS_FUSION_THRESHOLD": str(1 << 20), "PERSEUS_ALLREDUCE_STREAMS": "2",
               "PERSEUS_RANKS_PER_NODE": "1"})
    assert hvd.config()["PERSEUS_RANKS_PER_NODE"] == "1", hvd.config()
    total = hvd.allreduce(torch.full((5,), float(rank)), name="after", op=hvd.Sum)
    assert torch.equal(total, torch.full((5,), float(size * (size - 1) // 2))), total
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
