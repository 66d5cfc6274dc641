"""What a zero-copy node-local reduction could save against MPICH (issue 19).

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/zero_copy_potential.py [--model mlp512] [--steps 160]

Trains --model with SGD and momentum, one torch thread per rank, four ways taken
in turn step by step, all timed from a barrier at the start of the step to the end
of optimizer.step():
  ceiling  no reduction at all: the two ranks are two independent trainers
           sharing the machine (the ceiling of training_scaling.py);
  mpi      backward leaves fresh gradients; mpi4py's in-place Allreduce per
           tensor, then a division (the floor of any reducer built on MPICH);
  window   every p.grad is a view of this rank's slot of an MPI shared window
           (zeroed, so backward accumulates into it); rank r adds its share of
           every rank's slot and writes the average into all of them, between
           two node barriers;
  copy     backward leaves fresh gradients, copied into the window, averaged as
           in `window`; the optimizer then reads the window (as DDP's
           gradient_as_bucket_view does).
Prints, per way, the median step and the median reduction (from the end of
backward), and the ceiling's step over the way's step. On every --check-every'th
step of the two window ways the average is compared with MPICH's on copies (to
float32 rounding; those steps are not timed), so a faster path is known to
compute the same thing.

A prototype for measuring, not a transport: one process set, one node, float32,
and no library overhead at all, so its fractions bound what a node-local
zero-copy transport could reach on this machine.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# As training_scaling.py: glibc's heap trimming would make page faults, not the
# way, decide each step. glibc reads these at start, so the script re-executes
# itself with them, before MPI is initialised.
KEEP_FREED_MEMORY = {"MALLOC_TRIM_THRESHOLD_": str(1 << 34),
                     "MALLOC_MMAP_THRESHOLD_": str(1 << 32)}
if any(os.environ.get(k) != v for k, v in KEEP_FREED_MEMORY.items()):
    os.environ.update(KEEP_FREED_MEMORY)
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "pytorch"))
import models  # noqa: E402

WAYS = ("ceiling", "mpi", "window", "copy")


def window_grads(params, node):
    """One shared window with a float32 slot per rank, each as long as all the
    parameters; returns (window, the slots, views of this rank's slot shaped
    like each parameter)."""
    total = sum(p.numel() for p in params)
    size = node.Get_size()
    win = MPI.Win.Allocate_shared(4 * total * size if node.Get_rank() == 0 else 0, 4, comm=node)
    memory, _ = win.Shared_query(0)
    area = torch.frombuffer(memory, dtype=torch.float32)
    slots = [area[k * total:(k + 1) * total] for k in range(size)]
    views, offset = [], 0
    for p in params:
        views.append(slots[node.Get_rank()][offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    return win, slots, views


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


def reduce_with_mpi(grads, comm):
    for g in grads:
        comm.Allreduce(MPI.IN_PLACE, g.numpy())
        g.div_(comm.Get_size())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mlp512")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=160, help="in all, over the four ways")
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
    win, slots, views = window_grads(params, node)
    mine = slots[node.Get_rank()]
    data = torch.randn(args.batch_size, *shape)
    target = torch.randint(0, classes, (args.batch_size,))
    steps = {way: [] for way in WAYS}
    reductions = {way: [] for way in WAYS}
    for step in range(args.steps):
        way = WAYS[step % len(WAYS)]
        check = way in ("window", "copy") and args.check_every and \
            (step // len(WAYS)) % args.check_every == 0
        comm.Barrier()
        start = time.perf_counter()
        if way == "window":
            for p, view in zip(params, views):
                p.grad = view
            mine.zero_()
        else:
            opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(data), target).backward()
        backward_done = time.perf_counter()
        if check:
            reference = [p.grad.clone() for p in params]
            reduce_with_mpi(reference, comm)
        if way == "mpi":
            reduce_with_mpi([p.grad for p in params], comm)
        elif way in ("window", "copy"):
            if way == "copy":
                for p, view in zip(params, views):
                    view.copy_(p.grad)
                    p.grad = view
            reduce_in_window(slots, node.Get_rank(), node)
        reduced = time.perf_counter()
        if check:
            for p, g in zip(params, reference):
                torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)
        opt.step()
        if not check:
            steps[way].append(time.perf_counter() - start)
            reductions[way].append(reduced - backward_done)
    comm.Barrier()
    win.Free()
    if comm.Get_rank() == 0:
        skip = 2  # the first steps of each way warm caches and allocators
        step_ms = {w: statistics.median(t[skip:] or t) * 1e3 for w, t in steps.items()}
        reduce_ms = {w: statistics.median(t[skip:] or t) * 1e3 for w, t in reductions.items()}
        count = sum(p.numel() for p in params)
        print("%s, %d ranks, %.1f MB of float32 gradients, %d steps, %d timed each way"
              % (args.model, comm.Get_size(), count * 4 / 1e6, args.steps,
                 min(len(t) for t in steps.values())))
        for way in WAYS:
            print("%-8s step %7.2f ms  reduction %6.2f ms  fraction of the ceiling %.3f"
                  % (way, step_ms[way], reduce_ms[way], step_ms["ceiling"] / step_ms[way]))
        print("reduction, MPICH / window: %.2f" % (reduce_ms["mpi"] / reduce_ms["window"]))


if __name__ == "__main__":
    main()
