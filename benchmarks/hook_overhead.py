"""Per-gradient cost of the PyTorch training hooks (issue 19), at np=2:

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/hook_overhead.py [--layers 100] [--width 16]
                                                    [--iters 20] [--runs 9]

A model with many small parameters (--layers Linear(width, width): 2 gradients
each, a few KiB reduced in all, so communication is negligible) trains with lr=0
under three setups, built alike on every rank, in one process:
- plain:     forward + backward, no hooks: the baseline;
- optimizer: hvd.DistributedOptimizer: its backward (with the per-gradient hooks
             that start each allreduce) and its synchronize() timed apart;
- ddp:       perseus.torch.nn.parallel.DistributedDataParallel: backward (its
             hooks, bucket requests, and the wait at the end of backward).
Per-gradient microseconds, of wall time and of the training thread's CPU time
(time.thread_time: less disturbed by other processes on a busy machine; it
leaves out time lost to preemption and waiting), one torch thread per rank:
- opt hooks   = (optimizer backward - plain backward) / gradients
- opt sync    = synchronize() / gradients
- ddp         = (ddp backward - plain backward) / gradients
Each run times --iters iterations of every setup in turn (alternating, so load
from other processes falls on all alike), its value is the per-iteration median;
printed is the median (min) over --runs runs, on rank 0. To compare two
checkouts, run each alternately with PYTHONPATH pointing at it.
"""

import argparse
import statistics
import time

import torch

import perseus
import perseus.torch.horovod as hvd
from perseus.torch.nn.parallel import DistributedDataParallel


def _model(layers, width):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _now():
    return time.perf_counter(), time.thread_time()


def _since(start):
    """(wall, cpu) seconds since start = _now()."""
    wall, cpu = _now()
    return wall - start[0], cpu - start[1]


def _median(samples):
    """Per-component median of (wall, cpu) samples."""
    return tuple(statistics.median(column) for column in zip(*samples))


def _plain(model, x, iters):
    backward = []
    for _ in range(iters):
        model.zero_grad(set_to_none=True)
        loss = model(x).sum()
        start = _now()
        loss.backward()
        backward.append(_since(start))
    return _median(backward)


def _optimizer(model, opt, x, iters):
    backward, sync = [], []
    for _ in range(iters):
        opt.zero_grad(set_to_none=True)
        loss = model(x).sum()
        start = _now()
        loss.backward()
        backward.append(_since(start))
        start = _now()
        opt.synchronize()
        sync.append(_since(start))
        with opt.skip_synchronize():
            opt.step()
    return _median(backward), _median(sync)


_ddp = _plain  # the same loop: DDP's hooks and wait are inside backward()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=100)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()

    plain = _model(args.layers, args.width)
    hooked = _model(args.layers, args.width)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(hooked.parameters(), lr=0.0),
                                   named_parameters=hooked.named_parameters())
    ddp = DistributedDataParallel(_model(args.layers, args.width), broadcast_buffers=False)
    grads = sum(1 for _ in plain.parameters())
    x = torch.randn(args.batch, args.width)

    # Warm up: the core's name cache, layouts, DDP's first (bucket-learning) pass.
    _plain(plain, x, 3)
    _optimizer(hooked, opt, x, 3)
    _ddp(ddp, x, 3)

    rows = {"opt hooks": [], "opt sync": [], "ddp": [], "(plain backward)": []}
    for _ in range(args.runs):
        hvd.barrier()
        base = _plain(plain, x, args.iters)
        hvd.barrier()
        hooks, sync = _optimizer(hooked, opt, x, args.iters)
        hvd.barrier()
        ddp_backward = _ddp(ddp, x, args.iters)
        for label, value in (("opt hooks", [h - b for h, b in zip(hooks, base)]),
                             ("opt sync", sync),
                             ("ddp", [d - b for d, b in zip(ddp_backward, base)]),
                             ("(plain backward)", base)):
            rows[label].append([v / grads * 1e6 for v in value])

    if hvd.rank() == 0:
        print("perseus from %s; np=%d, %d gradients (%d x Linear(%d, %d)), batch %d; "
              "%d iters x %d runs; µs per gradient, median (min) over runs"
              % (perseus.__path__[0], hvd.size(), grads, args.layers, args.width, args.width,
                 args.batch, args.iters, args.runs))
        print("  %-17s %18s %18s" % ("", "wall", "thread CPU"))
        for label, values in rows.items():
            cells = []
            for column in zip(*values):
                cells.append("%8.2f (%7.2f)" % (statistics.median(column), min(column)))
            print("  %-17s %s" % (label, " ".join(cells)))
    hvd.shutdown()


if __name__ == "__main__":
    main()
