"""Configuration that differs between ranks fails init() on every rank with the same
clear error, never a hang: a bad value on one rank only, valid values that would make
ranks plan different collectives, stall times, a knob the autotuner would tune on some
ranks only, and a file only rank 0 writes set on some ranks only. Each error names the
variable as the user set it and the ranks' values. Afterwards a consistent setting works."""
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

    # Stall settings (issue 37, 3): the stall inspector of each rank relies on its
    # peers' answering within its own check time, so they are compared like the rest.
    # The error names the spelling the user set (rank 0's, else the differing rank's).
    for variable, value_of, shown in (
            ("PERSEUS_STALL_CHECK_TIME_SECONDS", lambda r: "2" if r == 0 else "", ("2", "60")),
            ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", lambda r: "5" if r == last else "", ("0", "5"))):
        differs = 1 if variable.startswith("PERSEUS") else last  # the first rank unlike rank 0
        expect_raises(ValueError, variable + " differs", init_with,
                      {variable: value_of(rank)} if value_of(rank) else {},
                      contains=("%s differs across ranks (rank 0: %s, rank %d: %s)"
                                % (variable, shown[0], differs, shown[1]),), within_s=30)
        assert not hvd.is_initialized()

    # The error names what the user set differently, not what follows from it (issue 37,
    # 8): autotuning on rank 0 only also changes the lanes made, which is not reported.
    e = expect_raises(ValueError, "autotune on rank 0 only", init_with,
                      {"HOROVOD_AUTOTUNE": "1"} if rank == 0 else {},
                      contains=("HOROVOD_AUTOTUNE differs across ranks (rank 0: 1, rank 1: 0)",),
                      within_s=30)
    assert "STREAMS" not in str(e), e
    assert not hvd.is_initialized()
    # With autotuning on everywhere, a knob set on some ranks only (even to its default)
    # is tuned on the others: whether it is set must agree too.
    tuned = {"PERSEUS_AUTOTUNE": "1"}
    if rank == last:
        tuned["PERSEUS_CHUNK_SIZE"] = "4194304"
    expect_raises(ValueError, "chunk size set on rank %d only, autotuning" % last, init_with, tuned,
                  contains=("PERSEUS_CHUNK_SIZE differs across ranks (rank 0: unset (left to "
                            "PERSEUS_AUTOTUNE), rank %d: 4194304)" % last,), within_s=30)
    assert not hvd.is_initialized()

    # Files only rank 0 writes (issue 37, 9): set on some ranks only is refused; a path
    # per rank is fine (tests/rank_scripts/timeline.py sets one).
    for variable in ("HOROVOD_TIMELINE", "PERSEUS_AUTOTUNE_LOG"):
        path = os.path.join(os.environ["PTEST_TMPDIR"], "%s-%d" % (variable, rank))
        expect_raises(ValueError, variable + " on rank %d only" % last, init_with,
                      {variable: path} if rank == last else {},
                      contains=("%s is set on some ranks only (rank 0: unset, rank %d: %s)"
                                % (variable, last, os.path.join(os.environ["PTEST_TMPDIR"],
                                                                "%s-%d" % (variable, last))),),
                      within_s=30)
        assert not hvd.is_initialized() and not os.path.exists(path), variable
    # Set on rank 0 only: refused before rank 0 opens (and truncates) the file.
    kept = os.path.join(os.environ["PTEST_TMPDIR"], "kept")
    if rank == 0:
        with open(kept, "w") as f:
            f.write("kept")
    expect_raises(ValueError, "HOROVOD_TIMELINE on rank 0 only", init_with,
                  {"HOROVOD_TIMELINE": kept} if rank == 0 else {},
                  contains=("HOROVOD_TIMELINE is set on some ranks only (rank 0: %s, rank 1: unset)"
                            % kept,), within_s=30)
    if rank == 0:
        with open(kept) as f:
            assert f.read() == "kept", "init() truncated the timeline file it then refused"
    expect_raises(ValueError, "mark cycles on rank 0 only", init_with,
                  {"PERSEUS_TIMELINE_MARK_CYCLES": "1"} if rank == 0 else {},
                  contains=("PERSEUS_TIMELINE_MARK_CYCLES differs across ranks (rank 0: 1, "
                            "rank 1: 0)",), within_s=30)
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
