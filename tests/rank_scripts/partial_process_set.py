"""Collective control operations called by only some ranks fail on those ranks, after
the stall check time (1 s here), with an error naming the ranks that did not call it,
instead of hanging:
- add_process_set: nothing is added; the next collective, and the next add_process_set
  that every rank calls, work;
- start_timeline (issue 37, 9): no timeline is started; the next one every rank calls
  writes its file.
"""
import os
import time

import torch

from common import assert_reduced, expect_raises, hvd, init, main, make_tensor, touch, wait_for


def body():
    rank, size = init()
    absent = size - 1
    ranks = [0, absent] if size > 2 else [absent]  # not the global set's ranks
    if rank != absent:
        start = time.monotonic()
        expect_raises(hvd.HorovodInternalError, "add_process_set without rank %d" % absent,
                      hvd.add_process_set, ranks,
                      contains=["add_process_set must be called on every rank",
                                "rank(s) [%d] did not call it" % absent], within_s=10)
        assert time.monotonic() - start >= 0.9, "gave up before the stall check time"
        touch("gave_up.%d" % rank)
    else:
        for r in range(size - 1):
            wait_for("gave_up.%d" % r)

    xs = [make_tensor("after", r, (6,), torch.float32) for r in range(size)]
    assert_reduced(hvd.allreduce(xs[rank], name="after", op=hvd.Sum), xs, hvd.Sum, torch.float32,
                   "allreduce after the failed add_process_set")

    check_partial_start_timeline(rank, size)

    pair = hvd.add_process_set(ranks)  # now every rank calls it
    assert pair.ranks == ranks and pair.process_set_id is not None, pair
    if rank in pair.ranks:
        ys = [make_tensor("pair", r, (3,), torch.float64) for r in ranks]
        got = hvd.allreduce(ys[pair.ranks.index(rank)], name="pair", op=hvd.Sum, process_set=pair)
        assert_reduced(got, ys, hvd.Sum, torch.float64, "allreduce on the set")
    hvd.shutdown()


def check_partial_start_timeline(rank, size):
    absent = size - 1
    path = os.path.join(os.environ["PTEST_TMPDIR"], "timeline%d.json" % rank)
    if rank != absent:
        start = time.monotonic()
        expect_raises(hvd.HorovodInternalError, "start_timeline without rank %d" % absent,
                      hvd.start_timeline, path,
                      contains=["start_timeline must be called on every rank: rank(s) [%d] did "
                                "not call it within 1 s" % absent, "no timeline was started"],
                      within_s=10)
        assert time.monotonic() - start >= 0.9, "gave up before the stall check time"
        assert not os.path.exists(path), "rank %d opened the timeline file" % rank
        touch("timeline_gave_up.%d" % rank)
    else:
        for r in range(size - 1):
            wait_for("timeline_gave_up.%d" % r)
    hvd.start_timeline(path)  # now every rank calls it
    hvd.allreduce(torch.ones(3), name="traced")
    hvd.stop_timeline()
    assert os.path.exists(path) == (rank == 0), "rank %d: timeline file %s" % (rank, path)
    if rank == 0:
        with open(path) as f:
            assert '"allreduce.traced"' in f.read(), "the timeline lacks the traced allreduce"


main(body)
