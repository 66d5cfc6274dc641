"""MPI started without MPI_THREAD_MULTIPLE (mpi4py at thread level 'serialized'): Perseus
falls back to one lane, serialising its own MPI calls, and every collective still
gives the right answer, even with more lanes asked for."""
import os

import mpi4py

mpi4py.rc.thread_level = "serialized"
from mpi4py import MPI  # noqa: E402

import torch  # noqa: E402

from common import hvd, main  # noqa: E402


def body():
    assert MPI.Query_thread() == MPI.THREAD_SERIALIZED
    os.environ["PERSEUS_ALLREDUCE_STREAMS"] = "4"
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert not hvd.mpi_threads_supported()
    assert hvd.lane_count() == 1, hvd.lane_count()
    handles = [hvd.allreduce_async(torch.full((1000 + i,), float(rank + i)), name="s%d" % i,
                                   op=hvd.Sum) for i in range(20)]
    for i, h in enumerate(handles):
        expected = sum(r + i for r in range(size))
        assert torch.equal(hvd.synchronize(h), torch.full((1000 + i,), float(expected)))
    gathered = hvd.allgather(torch.full((rank + 1, 2), rank), name="g")
    assert gathered.shape == (size * (size + 1) // 2, 2)
    root = hvd.broadcast(torch.full((3,), float(rank)), root_rank=size - 1, name="b")
    assert torch.equal(root, torch.full((3,), float(size - 1)))
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
