"""A rank whose engine calls exit() from inside an MPI call (as MPICH does when a call
fails fatally) must exit, and so must the job: the exit handlers may not wait for the
engine's threads, one of which is inside that call.

PTEST_EXIT_RANK's lane exits with code 70 while running "allreduce.fatal" (the test hook
PERSEUS_TEST_EXIT_IN_LANE); the other ranks are left inside the same allreduce, and the
launcher tears them down once the victim's exit is seen.
"""
import os

import torch

from common import hvd, init, launcher_rank_size, main, touch

VICTIM = int(os.environ["PTEST_EXIT_RANK"])


def body():
    if launcher_rank_size()[0] == VICTIM:
        os.environ["PERSEUS_TEST_EXIT_IN_LANE"] = "allreduce.fatal"  # read at the first batch
    rank, size = init()
    ok = hvd.allreduce(torch.ones(4), name="warmup", op=hvd.Sum)
    assert ok.tolist() == [float(size)] * 4, ok
    if rank == VICTIM:
        touch("exiting")
    hvd.allreduce(torch.ones(4), name="fatal", op=hvd.Sum)
    raise AssertionError("rank %d returned from the allreduce during which rank %d exited"
                         % (rank, VICTIM))


main(body)
