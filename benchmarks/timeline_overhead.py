"""What the timeline costs the hot path: allreduce time with the timeline off and on.

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/timeline_overhead.py [--pairs 15] [--seconds 0.25]

Each pair times the same loop twice, once with the timeline off and once writing
one (start_timeline / stop_timeline between them, the order alternating per pair),
so drift on this noisy machine hits both alike. Three workloads: one 4 KiB
allreduce at a time (the most events per second the engine makes), one 1 MiB
allreduce at a time, 40 small async allreduces then a wait for all (a backward
pass's gradients), and a whole training step of a small ResNet. Loops are sized
to take about --seconds each. Rank 0 prints per-op medians and the median of the
per-pair on/off ratios; 1.00 means no cost.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import perseus.torch.horovod as hvd
from perseus.timeline_summary import load_events


def one_at_a_time(numel):
    tensor = torch.ones(numel)

    def run():
        hvd.allreduce_(tensor, name="timed", op=hvd.Sum)
    return run


def gradient_burst(count=40, numel=4096):
    tensors = [torch.ones(numel) for _ in range(count)]
    names = ["grad.%d" % i for i in range(count)]

    def run():
        handles = [hvd.allreduce_async_(t, name=n, op=hvd.Sum) for t, n in zip(tensors, names)]
        for h in handles:
            hvd.synchronize(h)
    return run


def training_step():
    """One SGD step of the synthetic benchmark's resnet_small (batch 32) through
    DistributedOptimizer: what the timeline costs a real backward pass."""
    import torch.nn.functional as F
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "pytorch"))
    import models
    build, shape, classes = models.MODELS["resnet_small"]
    torch.manual_seed(0)
    model = build()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    data, target = torch.randn(32, *shape), torch.randint(0, classes, (32,))

    def run():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()
    return run


def calibrate(run, seconds):
    """Iterations that take about `seconds`, agreed by every rank (the max)."""
    for _ in range(20):
        run()
    start = time.perf_counter()
    for _ in range(20):
        run()
    per_op = (time.perf_counter() - start) / 20
    wanted = torch.tensor([max(20, int(seconds / per_op))])
    return int(hvd.allreduce(wanted, name="calibrate", op=hvd.Max).item())


def time_loop(run, iters):
    for _ in range(max(2, iters // 20)):
        run()
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        run()
    return (time.perf_counter() - start) / iters * 1e6


def measure(run, iters, pairs, path):
    off, on = [], []
    for p in range(pairs):
        for timeline_on in ((False, True) if p % 2 == 0 else (True, False)):
            if timeline_on:
                hvd.start_timeline(path)
                on.append(time_loop(run, iters))
                hvd.stop_timeline()
            else:
                off.append(time_loop(run, iters))
    return off, on


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.25, help="per timed loop")
    args = parser.parse_args()
    hvd.init()
    workloads = [("4 KiB allreduce", one_at_a_time(1024)),
                 ("1 MiB allreduce", one_at_a_time(256 * 1024)),
                 ("40 x 16 KiB async burst", gradient_burst()),
                 ("resnet_small training step", training_step())]
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "timeline.json")
        rows = []
        for label, run in workloads:
            iters = calibrate(run, args.seconds)
            off, on = measure(run, iters, args.pairs, path)
            ratios = [a / b for a, b in zip(on, off)]
            rows.append((label, statistics.median(off), statistics.median(on),
                         statistics.median(ratios), min(ratios), max(ratios)))
        size = os.path.getsize(path) if hvd.rank() == 0 else 0
        dropped = sum(e.get("args", {}).get("events", 0) for e in load_events(path)
                      if e.get("name") == "TIMELINE_DROPPED") if hvd.rank() == 0 else 0
    if hvd.rank() == 0:
        print("np=%d, %d pairs; times per op (burst: per burst), medians" % (hvd.size(), args.pairs))
        print("| workload | off us | on us | on/off (median) | on/off range |")
        print("|---|---:|---:|---:|---:|")
        for label, off, on, ratio, low, high in rows:
            print("| %s | %.1f | %.1f | %.3f | %.3f-%.3f |" % (label, off, on, ratio, low, high))
        print("last timeline file: %d bytes, %d events dropped" % (size, dropped))
    hvd.shutdown()


if __name__ == "__main__":
    main()
