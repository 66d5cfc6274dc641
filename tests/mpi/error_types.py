"""The exception types a Horovod PyTorch script catches for invalid collective
arguments (Horovod 0.28.1's tests): RuntimeError for an uneven equal-split alltoall,
splits that do not fit, and a scalar reducescatter; ValueError for float splits.
Perseus raises one error that is both, on every rank, and goes on working."""
import torch

from common import hvd, log, main


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    cases = [
        ("uneven equal-split alltoall", lambda: hvd.alltoall(torch.ones(size + 1)), RuntimeError),
        ("splits that do not fit", lambda: hvd.alltoall(
            torch.ones(size - 1), torch.ones(size, dtype=torch.int32)), RuntimeError),
        ("float splits", lambda: hvd.alltoall(
            torch.ones(size), torch.ones(size, dtype=torch.float32)), ValueError),
        ("scalar reducescatter", lambda: hvd.reducescatter(torch.tensor(float(rank))),
         RuntimeError),
        ("scalar in grouped_reducescatter", lambda: hvd.grouped_reducescatter(
            [torch.zeros(3, 1), torch.tensor(float(rank))]), RuntimeError),
    ]
    for what, bad, horovod_catches in cases:
        try:
            bad()
        except horovod_catches as e:
            assert isinstance(e, ValueError) and isinstance(e, RuntimeError), (what, type(e))
        else:
            raise AssertionError("%s was not refused" % what)
        log(what, "refused")
    out = hvd.alltoall(torch.arange(size, dtype=torch.float32))
    out = out[0] if isinstance(out, tuple) else out
    assert torch.equal(out, torch.full((size,), float(rank))), out
    hvd.shutdown()


main(body)
