"""Allreduce latency of the TensorFlow front end, eager and inside tf.function, with
what TensorFlow itself costs to call a function, all in one run.

    .venv/bin/mpirun -np 2 .venv-tf/bin/python benchmarks/tf_allreduce_bench.py

Cases, per size (each repeat runs every case for --iters calls, in turn, so the
slow phases of a shared machine hit them alike; a case's figure is the median over
repeats of its per-repeat median, and, on a second line, their 25th percentile:
the quieter phases, when other jobs on the machine left the cores alone):
  eager       hvd.allreduce(x)
  function    tf.function(lambda t: hvd.allreduce(t))(x)
  empty fn    tf.function(lambda t: t)(x)        TensorFlow's own call cost
  +1 fn       tf.function(lambda t: t + 1)(x)    ... with one (trivial) kernel to run
  K fn        one tf.function doing --per-op allreduces of x (K names)
  fn, handed  function, traced with mpi_ops.GRAPH_DRIVE_S = 0: the op hands the
              request to the engine thread (how graph ops worked before issue 16.12)
  raw MPI     mpi4py Allreduce of the same bytes (the floor)
Derived: "ours in fn" = function - (+1 fn), what the allreduce adds to a function
that runs one kernel; "per op in fn" = (K fn - function) / (K - 1), the cost of one
more allreduce in a function.
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import perseus.tensorflow.horovod as hvd  # noqa: E402
from perseus.tensorflow import mpi_ops  # noqa: E402


def median_us(fn, iters):
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * float(np.median(times))


def cases(nbytes, per_op):
    """name -> a call that returns once its result is on the host."""
    x = tf.ones([nbytes // 4], tf.float32)
    buf, out = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
    comm = MPI.COMM_WORLD
    function = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name="bench"))
    empty = tf.function(lambda t: t)
    plus1 = tf.function(lambda t: t + 1)
    k_fn = tf.function(lambda t: [hvd.allreduce(t, op=hvd.Sum, name="bench.k%d" % i)
                                  for i in range(per_op)])
    handed = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name="bench.handed"))
    drive_s, mpi_ops.GRAPH_DRIVE_S = mpi_ops.GRAPH_DRIVE_S, 0.0  # read when tracing
    handed.get_concrete_function(x)
    mpi_ops.GRAPH_DRIVE_S = drive_s
    return {
        "eager": lambda: hvd.allreduce(x, op=hvd.Sum, name="bench").numpy(),
        "function": lambda: function(x).numpy(),
        "empty fn": lambda: empty(x).numpy(),
        "+1 fn": lambda: plus1(x).numpy(),
        "K fn": lambda: [r.numpy() for r in k_fn(x)],
        "fn, handed": lambda: handed(x).numpy(),
        "raw MPI": lambda: comm.Allreduce(buf, out),
    }


def measure(nbytes, args):
    calls = cases(nbytes, args.per_op)
    repeats = args.repeats if nbytes < 1 << 20 else max(3, args.repeats // 8)
    for call in calls.values():  # trace, warm up
        call()
        call()
    runs = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            MPI.COMM_WORLD.Barrier()
            runs[name].append(median_us(call, args.iters))
    return runs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=5, help="calls per case and repeat")
    p.add_argument("--repeats", type=int, default=40, help="(one eighth from 1 MiB)")
    p.add_argument("--per-op", type=int, default=8, help="allreduces in the 'K fn' case")
    p.add_argument("--sizes", default="4096,16777216", help="bytes, comma-separated")
    p.add_argument("--threads", type=int, default=0,
                   help="TensorFlow inter/intra-op threads (0: TensorFlow's default)")
    args = p.parse_args()
    if args.threads:  # a user's choice, shown here as a hint; the library sets none
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    hvd.init()
    rows = [(int(s), measure(int(s), args)) for s in args.sizes.split(",")]
    if hvd.rank() == 0:
        print("np=%d, TensorFlow %s, threads %s; %d repeats of %d calls (fewer from 1 MiB), us"
              % (hvd.size(), tf.__version__, args.threads or "default", args.repeats, args.iters))
        header = ("bytes", "eager", "function", "fn/eager", "empty fn", "+1 fn", "ours in fn",
                  "ours/eager", "per op in fn", "fn, handed", "raw MPI")
        print(("%10s" + " %12s" * (len(header) - 1)) % header)
        for (nbytes, runs), stat in [(row, stat) for row in rows for stat in (50, 25)]:
            m = {name: float(np.percentile(v, stat)) for name, v in runs.items()}
            ours = m["function"] - m["+1 fn"]
            per_op = (m["K fn"] - m["function"]) / max(1, args.per_op - 1)
            print(("%10s" + " %12.1f" * 2 + " %12.2f" + " %12.1f" * 3 + " %12.2f" + " %12.1f" * 3)
                  % (nbytes if stat == 50 else "p%d" % stat, m["eager"], m["function"],
                     m["function"] / m["eager"], m["empty fn"], m["+1 fn"], ours, ours / m["eager"],
                     per_op, m["fn, handed"], m["raw MPI"]))
    hvd.shutdown()


if __name__ == "__main__":
    main()
