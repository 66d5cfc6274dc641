"""A request that only one rank refuses locally (a ValueError raised on that rank
before anything is sent, here a bool allreduce) leaves the other ranks waiting for
it: nothing reaches them. The stall warning (run with a stall time of 1 s) then says
which rank stopped submitting and what it submitted last. Once the refusing rank
submits the request correctly, everyone completes: once every other rank warned
(within the 3 s the refusing rank used to sleep; files in PTEST_TMPDIR say so).
"""
import torch

from common import assert_reduced, expect_raises, hvd, init, main, make_tensor, touch, wait_for
from support.rank_script import CapturedStderr


def body():
    rank, size = init()
    refuser = size - 1
    xs = [make_tensor("before", r, (4,), torch.float32) for r in range(size)]
    assert_reduced(hvd.allreduce(xs[rank], name="before", op=hvd.Sum), xs, hvd.Sum, torch.float32,
                   "before")
    xs = [make_tensor("refused", r, (4,), torch.float32) for r in range(size)]
    want = ["'allreduce.refused' (submitted by rank(s) [%s], missing on rank(s) [%d])"
            % (", ".join(str(r) for r in range(size - 1)), refuser),
            "Rank(s) with nothing pending, which stopped submitting: %d (last submitted "
            "'allreduce.before')" % refuser]
    with CapturedStderr() as err:
        if rank == refuser:
            expect_raises(ValueError, "bool allreduce", hvd.allreduce, torch.ones(4, dtype=torch.bool),
                          name="refused", op=hvd.Sum, contains=["bool"], within_s=5)
            for other in range(size - 1):  # the others warn meanwhile
                wait_for("warned.%d" % other)
            got = hvd.allreduce(xs[rank], name="refused", op=hvd.Sum)
        else:
            handle = hvd.allreduce_async(xs[rank], name="refused", op=hvd.Sum)
            for text in want:
                err.wait_for_text(text, 3)
            touch("warned.%d" % rank)
            got = hvd.synchronize(handle)
    assert_reduced(got, xs, hvd.Sum, torch.float32, "refused, then submitted")
    if rank != refuser:
        for text in want:
            assert text in err.text, "%r not in the warning:\n%s" % (text, err.text)
    hvd.shutdown()


main(body)
