"""Lifecycle without mpi4py: errors before init(), topology against the launcher's own
view (PMI_RANK / PMI_SIZE from MPICH's hydra), shutdown() then init() again several times,
and shutdown() with a request still pending (an error for its waiter, never a hang)."""
import torch

from common import assert_reduced, expect_raises, hvd, launcher_rank_size, main, make_tensor


def check_not_initialized(what):
    assert not hvd.is_initialized(), what + ": is_initialized() is true"
    for fn in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.is_homogeneous):
        expect_raises(ValueError, "%s: %s()" % (what, fn.__name__), fn)
    expect_raises(ValueError, what + ": allreduce", hvd.allreduce, torch.ones(2), name="x", op=hvd.Sum)
    expect_raises(ValueError, what + ": broadcast", hvd.broadcast, torch.ones(2), 0, name="x")


def check_sum(name, rank, size):
    xs = [make_tensor(name, r, (12,), torch.float32) for r in range(size)]
    assert_reduced(hvd.allreduce(xs[rank], name=name, op=hvd.Sum), xs, hvd.Sum, torch.float32, name)


def body():
    check_not_initialized("before init")

    hvd.init()
    assert hvd.is_initialized()
    rank, size = launcher_rank_size()
    assert hvd.size() == size, "size() %r, the launcher started %d" % (hvd.size(), size)
    assert hvd.rank() == rank, "rank() %r, the launcher says %d" % (hvd.rank(), rank)
    # One host: local == global, a single cross-node group.
    assert hvd.local_size() == size and hvd.local_rank() == rank, (hvd.local_size(), hvd.local_rank())
    assert hvd.cross_size() == 1 and hvd.cross_rank() == 0, (hvd.cross_size(), hvd.cross_rank())
    assert hvd.is_homogeneous() is True
    assert hvd.mpi_enabled() and hvd.mpi_built()
    assert hvd.mpi_threads_supported() in (True, False)
    check_sum("lifecycle", rank, size)

    for cycle in range(3):
        hvd.shutdown()
        check_not_initialized("after shutdown #%d" % cycle)
        hvd.init()
        assert hvd.size() == size and hvd.rank() == rank
        check_sum("lifecycle", rank, size)  # the same name as before the restart

    # A request only rank 0 submits is pending at shutdown: its waiter gets an error.
    orphan = hvd.allreduce_async(torch.ones(3), name="orphan", op=hvd.Sum) if rank == 0 else None
    hvd.shutdown()
    if orphan is not None:
        expect_raises(Exception, "waiting on a request cut off by shutdown()", hvd.synchronize, orphan,
                      within_s=30)

    hvd.init()
    check_sum("orphan", rank, size)  # the name is not stuck from before
    hvd.shutdown()
    hvd.shutdown()  # a second shutdown is harmless
    assert not hvd.is_initialized()


main(body)
