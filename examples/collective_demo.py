"""A small multi-process job: every collective of perseus.torch.horovod once,
each result checked against what the ranks' inputs imply.

    .venv/bin/mpirun -np 2 .venv/bin/python examples/collective_demo.py
"""
import argparse

import torch

import perseus.torch.horovod as hvd


def main():
    # No options; --help says what the demo does instead of running it.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    say = print if rank == 0 else (lambda *a: None)
    say(f"Perseus demo on {size} ranks ({hvd.local_size()} on this node)")

    grad = torch.full((4,), float(rank + 1))
    mean = hvd.allreduce(grad, name="grad")  # Average by default, as in Horovod
    assert torch.allclose(mean, torch.full((4,), (size + 1) / 2))
    say("allreduce (average):", mean.tolist())

    rows = hvd.allgather(torch.full((rank + 1, 2), float(rank)), name="rows")
    assert rows.shape[0] == size * (size + 1) // 2
    say("allgather rows:", rows.shape[0])

    weights = hvd.broadcast(torch.randn(3), root_rank=0, name="weights")
    first = hvd.allgather(weights.unsqueeze(0), name="check")
    assert all(torch.equal(first[0], first[r]) for r in range(size))
    say("broadcast: every rank holds rank 0's tensor")

    handles = [hvd.allreduce_async(torch.ones(1000) * i, name=f"g{i}", op=hvd.Sum)
               for i in range(10)]
    sums = [hvd.synchronize(h) for h in handles]
    assert all(torch.all(s == i * size) for i, s in enumerate(sums))
    say("10 async allreduces fused and completed")

    received = hvd.alltoall(torch.arange(size, dtype=torch.float32) + 10 * rank, name="a2a")
    assert received.tolist() == [10.0 * r + rank for r in range(size)]
    say("alltoall:", received.tolist())

    hvd.barrier()
    hvd.shutdown()
    say("demo finished: all results correct")


if __name__ == "__main__":
    main()
