"""Allreduce latency of the TensorFlow front end: eager, inside tf.function, and raw
mpi4py Allreduce on the same buffers, in one run (medians of `--iters` calls).

    .venv/bin/mpirun -np 2 .venv-tf/bin/python benchmarks/tf_allreduce_bench.py
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import perseus.tensorflow.horovod as hvd  # noqa: E402


def median_us(fn, iters):
    fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * float(np.median(times))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--sizes", default="4096,16777216", help="bytes, comma-separated")
    p.add_argument("--threads", type=int, default=0,
                   help="TensorFlow inter/intra-op threads (0: TensorFlow's default)")
    args = p.parse_args()
    if args.threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    hvd.init()
    comm = MPI.COMM_WORLD
    rows = []
    for nbytes in [int(s) for s in args.sizes.split(",")]:
        n = nbytes // 4
        x = tf.ones([n], tf.float32)
        buf, out = np.ones(n, np.float32), np.empty(n, np.float32)
        fn = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name="bench"))
        iters = args.iters if nbytes < 1 << 20 else max(5, args.iters // 10)
        comm.Barrier()
        eager = median_us(lambda: hvd.allreduce(x, op=hvd.Sum, name="bench").numpy(), iters)
        comm.Barrier()
        graph = median_us(lambda: fn(x).numpy(), iters)
        comm.Barrier()
        raw = median_us(lambda: comm.Allreduce(buf, out), iters)
        rows.append((nbytes, eager, graph, raw))
    if hvd.rank() == 0:
        print("%10s %12s %14s %12s" % ("bytes", "eager us", "tf.function us", "raw MPI us"))
        for nbytes, eager, graph, raw in rows:
            print("%10d %12.1f %14.1f %12.1f" % (nbytes, eager, graph, raw))
    hvd.shutdown()


if __name__ == "__main__":
    main()
