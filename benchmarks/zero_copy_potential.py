"""What a zero-copy node-local reduction could save against MPICH (issue 19).

    mpirun -np 2 python benchmarks/zero_copy_potential.py [--model mlp512] [--steps 60]

Trains --model with plain SGD, one torch thread per rank, with every gradient
living in an MPI shared window (p.grad is a view of this rank's slot, so backward
writes the gradients there). After each backward and a barrier, alternating by
step, the gradients are averaged either by MPICH (mpi4py's in-place Allreduce per
tensor, then a division) or in place in the window: rank r adds its share of
every rank's slot and writes the average into all of them, between two node
barriers. Prints the median time of each and their ratio. Every --check-every
steps the window's result is compared with MPICH's on copies (it must match to
float32 rounding), so the faster path is known to compute the same thing.

A prototype for measuring, not a transport: one process set, one node, float32.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "pytorch"))
import models  # noqa: E402


def window_grads(params, node):
    """Gives every parameter a .grad viewing this rank's slot of one shared window;
    returns the slots of all ranks (flat float32 tensors)."""
    total = sum(p.numel() for p in params)
    size = node.Get_size()
    win = MPI.Win.Allocate_shared(4 * total * size if node.Get_rank() == 0 else 0, 4, comm=node)
    memory, _ = win.Shared_query(0)
    area = torch.frombuffer(memory, dtype=torch.float32)
    slots = [area[k * total:(k + 1) * total] for k in range(size)]
    offset = 0
    for p in params:
        p.grad = slots[node.Get_rank()][offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return win, slots


def reduce_in_window(slots, rank, node):
    """Averages the slots into every slot: rank r reduces its share of the elements."""
    size, total = len(slots), slots[0].numel()
    lo, hi = total * rank // size, total * (rank + 1) // size
    node.Barrier()  # every rank's gradients are in
    mine = slots[rank][lo:hi]
    for k in range(size):
        if k != rank:
            mine.add_(slots[k][lo:hi])
    mine.div_(size)
    for k in range(size):
        if k != rank:
            slots[k][lo:hi].copy_(mine)
    node.Barrier()  # every share is written before anyone reads or overwrites


def reduce_with_mpi(params, comm):
    for p in params:
        comm.Allreduce(MPI.IN_PLACE, p.grad.numpy())
        p.grad.div_(comm.Get_size())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mlp512")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--check-every", type=int, default=10)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    if node.Get_size() != comm.Get_size():
        raise SystemExit("zero_copy_potential.py runs on one node only")
    torch.set_num_threads(1)
    torch.manual_seed(comm.Get_rank())  # different gradients on every rank
    build, shape, classes = models.MODELS[args.model]
    model = build()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    win, slots = window_grads(params, node)
    data = torch.randn(args.batch_size, *shape)
    target = torch.randint(0, classes, (args.batch_size,))
    times = {"mpi": [], "window": []}
    for step in range(args.steps):
        opt.zero_grad(set_to_none=False)  # keeps the views
        F.cross_entropy(model(data), target).backward()
        check = args.check_every and step % args.check_every == 0
        if check:
            reference = [p.grad.clone() for p in params]
            for g in reference:
                comm.Allreduce(MPI.IN_PLACE, g.numpy())
                g.div_(comm.Get_size())
        way = "mpi" if step % 2 else "window"
        comm.Barrier()
        start = time.perf_counter()
        if way == "mpi":
            reduce_with_mpi(params, comm)
        else:
            reduce_in_window(slots, node.Get_rank(), node)
        times[way].append(time.perf_counter() - start)
        if check:
            for p, g in zip(params, reference):
                torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)
        opt.step()
    comm.Barrier()
    win.Free()
    if comm.Get_rank() == 0:
        skip = 2  # the first steps of each way warm caches and allocators
        mpi_ms = statistics.median(times["mpi"][skip:]) * 1e3
        window_ms = statistics.median(times["window"][skip:]) * 1e3
        count = sum(p.numel() for p in params)
        print("%s, %d ranks, %.1f MB of float32 gradients, %d steps each way"
              % (args.model, comm.Get_size(), count * 4 / 1e6, len(times["mpi"])))
        print("MPICH in-place Allreduce per tensor: %.2f ms" % mpi_ms)
        print("in place in the shared window:       %.2f ms" % window_ms)
        print("MPICH / window: %.2f" % (mpi_ms / window_ms))


if __name__ == "__main__":
    main()
