"""What a collective control operation costs: add/remove_process_set, start/stop_timeline
and barrier, against a raw MPI barrier.

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/control_ops.py [--calls 20] [--rounds 5]

Each round times --calls calls of each case, the cases interleaved round by round so
that a change in the machine's load weighs on all alike; the table gives each case's
median over every call (ms), and its ratio to the median raw barrier (mpi4py's
MPI.COMM_WORLD.Barrier() in the same run). Rank 0 prints; the other ranks time the
same calls. To compare two checkouts, run each with PYTHONPATH pointing at it.

Issue 37 (10): add_process_set used to sit out the engine's hold (PERSEUS_HOLD_TIME,
200 ms) before its ranks met; the goal is 10 ms or less at np=2.
"""
import argparse
import os
import statistics
import tempfile
import time

from mpi4py import MPI  # before init(): Perseus then runs on the MPI mpi4py started

import perseus.torch.horovod as hvd


def add_remove(size):
    hvd.remove_process_set(hvd.add_process_set([size - 1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    timeline = os.path.join(tempfile.gettempdir(), "perseus-control-ops-%d.json" % os.getpid())
    cases = [
        ("raw MPI barrier (mpi4py)", MPI.COMM_WORLD.Barrier),
        ("hvd.barrier()", hvd.barrier),
        ("add_process_set + remove_process_set", lambda: add_remove(size)),
        ("start_timeline + stop_timeline", lambda: (hvd.start_timeline(timeline),
                                                    hvd.stop_timeline())),
    ]
    samples = {name: [] for name, _ in cases}
    for _ in range(args.rounds):
        for name, call in cases:
            call()  # warm: the first call of a round may meet peers still in the last case
            for _ in range(args.calls):
                start = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - start)
    hvd.shutdown()
    if rank == 0:
        if os.path.exists(timeline):
            os.remove(timeline)
        raw = statistics.median(samples[cases[0][0]])
        print("np=%d, %d calls x %d rounds; HOLD_BYTES=%s HOLD_TIME=%s"
              % (size, args.calls, args.rounds, os.environ.get("PERSEUS_HOLD_BYTES", "auto"),
                 os.environ.get("PERSEUS_HOLD_TIME", "200")))
        print("%-40s %12s %12s %10s" % ("case", "median ms", "max ms", "x raw"))
        for name, _ in cases:
            median = statistics.median(samples[name])
            print("%-40s %12.3f %12.3f %10.1f"
                  % (name, median * 1e3, max(samples[name]) * 1e3, median / raw))


if __name__ == "__main__":
    main()
