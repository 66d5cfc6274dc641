"""Per-call cost of `hvd.allreduce_` on a small tensor at size 1: the Python overhead.

    python benchmarks/python_overhead.py [--calls 20000] [--runs 7] [--bytes 4096]

Two numbers, each the median (and minimum) over --runs loops of --calls calls:
- end to end: the real call (enqueue, the engine's round with itself, wait);
- python side: the same call with the core's enqueue/wait/release replaced by
  no-op stubs, so only Perseus' Python code (adapter, builder, requests) is timed.
Times are CPU time of this process (time.process_time), which a busy machine
disturbs less than wall time. To compare two checkouts, run each alternately with
PYTHONPATH pointing at it.
"""

import argparse
import statistics
import time

import torch

import perseus
import perseus.torch.horovod as hvd
from perseus.common import library as _lib
from perseus.common import requests as _requests


def _loop(tensor, calls, named):
    call = hvd.allreduce_
    start = time.process_time()
    if named:
        for _ in range(calls):
            call(tensor, name="overhead", op=hvd.Sum)
    else:
        for _ in range(calls):
            call(tensor, op=hvd.Sum)
    return (time.process_time() - start) / calls * 1e6


def _measure(tensor, calls, runs, named):
    _loop(tensor, calls // 10 or 1, named)  # warm up (layouts, counters, caches)
    samples = [_loop(tensor, calls, named) for _ in range(runs)]
    return statistics.median(samples), min(samples)


def _stub_core():
    """Replaces the core calls requests.py makes with no-ops returning success: in
    perseus.common.library, and wherever requests.py bound them to names of its own
    (older checkouts), so that one script times either."""
    stubs = {"perseus_enqueue_and_drive": lambda requests, n, handles, drive_s: 0,
             "perseus_run": lambda requests, n, handles, timeout_s: 0,
             "perseus_enqueue": lambda requests, n, handles: 0,
             "perseus_wait": lambda handle, timeout_s: 0,
             "perseus_release": lambda handle: 0}
    for name, stub in stubs.items():
        real = getattr(_lib, name, None)
        if real is None:
            continue  # an older checkout without it
        setattr(_lib, name, stub)
        for alias, value in list(vars(_requests).items()):
            if value is real:
                setattr(_requests, alias, stub)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--bytes", type=int, default=4096)
    args = parser.parse_args()
    hvd.init()
    if hvd.size() != 1:
        raise SystemExit("run it without mpirun (size 1)")
    tensor = torch.zeros(args.bytes // 4, dtype=torch.float32)
    print("perseus from %s; %d B float32, %d calls x %d runs; µs per call, median (min)"
          % (perseus.__path__[0], args.bytes, args.calls, args.runs))
    for label in ("end to end", "python side"):
        if label == "python side":
            _stub_core()
        for named in (False, True):
            median, low = _measure(tensor, args.calls, args.runs, named)
            print("  %-11s %-7s %7.2f (%.2f)" % (label, "named" if named else "unnamed", median,
                                                 low))
    hvd.shutdown()


if __name__ == "__main__":
    main()
