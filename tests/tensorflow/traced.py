"""The tf.function path of the TensorFlow ops, with one inter-op thread (the
tightest case for a graph op that drives the engine on TensorFlow's thread):

- running a traced collective runs no Perseus Python (names and attributes are
  baked into the graph at trace time);
- allreduce and broadcast work in place on an input nothing else reads, and leave
  an input that another op reads untouched (several dtypes and shapes, scaled,
  grouped with the same tensor twice);
- two independent collectives that the ranks reach in opposite orders (a TF1
  graph), while each rank's only inter-op thread drives the engine for the first,
  still complete, and soon: a graph op gives up driving after
  mpi_ops.GRAPH_DRIVE_S.
"""
import os
import sys
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)

from common import FLOAT_DTYPES, INT_DTYPES, assert_equal, hvd, log, main, make_array  # noqa: E402
from perseus.tensorflow import mpi_ops  # noqa: E402

PERSEUS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(mpi_ops.__file__)))


def perseus_python_calls(fn, *args):
    """How many Python functions of the perseus package run during fn(*args)."""
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PERSEUS_DIR):
            calls.append(frame.f_code.co_name)
    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return calls


def run_no_python_per_call(rank, size):
    xs = [make_array("np", r, (5,), tf.float32) for r in range(size)]
    x = tf.constant(xs[rank], tf.float32)
    fn = tf.function(lambda t: [hvd.allreduce(t, op=hvd.Sum),
                                hvd.grouped_allreduce([t, 2 * t], op=hvd.Sum)[1],
                                hvd.broadcast(t, 0), hvd.allgather(t)])
    fn(x)  # traces: the Perseus Python runs here, once
    for _ in range(3):
        calls = perseus_python_calls(lambda: [t.numpy() for t in fn(x)])
        assert not calls, "a traced call ran Perseus Python: %s" % calls[:10]
    got = fn(x)
    assert_equal(got[0], sum(xs), tf.float32, "traced allreduce")
    assert_equal(got[1], 2 * sum(xs), tf.float32, "traced grouped allreduce")
    assert_equal(got[2], xs[0], tf.float32, "traced broadcast")
    assert_equal(got[3], np.concatenate(xs), tf.float32, "traced allgather")


def run_in_place(rank, size):
    # Each intermediate t * k - 1 has its own k, so that no graph optimisation merges
    # them into one tensor that several ops read.
    for dtype in INT_DTYPES[1:] + FLOAT_DTYPES:  # signed: t * k - 1 may be negative
        for shape in [(), (0,), (3, 4), (1000,)]:
            what = "%s %s" % (dtype.name, shape)
            xs = [make_array("ip" + what, r, shape, tf.float64) for r in range(size)]
            x = tf.cast(xs[rank], dtype)

            def ys(k):  # every rank's t * k - 1
                return [k * v - 1 for v in xs]

            @tf.function
            def f(t):
                shared = t * 3 - 1  # also read by the add below: not reduced in place
                if dtype.is_floating:
                    average = hvd.allreduce(t * 6 - 1, op=hvd.Average)
                    scaled = hvd.allreduce(t * 7 - 1, op=hvd.Sum, prescale_factor=2.0,
                                           postscale_factor=0.5)
                else:
                    average = hvd.allreduce(t * 6 - 1, op=hvd.Max)
                    scaled = hvd.allreduce(t * 7 - 1, op=hvd.Min)
                return (hvd.allreduce(t * 2 - 1, op=hvd.Sum),  # read by the allreduce only
                        hvd.allreduce(shared, op=hvd.Sum), shared + 0,
                        hvd.broadcast(t * 4 - 1, size - 1),
                        hvd.grouped_allreduce([t * 5 - 1] * 2, op=hvd.Sum),
                        average, scaled)
            alone, shared, after, root, pair, average, scaled = f(x)
            assert_equal(alone, sum(ys(2)), dtype, "in-place allreduce " + what)
            assert_equal(shared, sum(ys(3)), dtype, "allreduce of a shared input " + what)
            assert_equal(after, ys(3)[rank], dtype, "the shared input after the allreduce " + what)
            assert_equal(root, ys(4)[size - 1], dtype, "in-place broadcast " + what)
            for i, out in enumerate(pair):
                assert_equal(out, sum(ys(5)), dtype,
                             "grouped allreduce of one tensor twice [%d] %s" % (i, what))
            if dtype.is_floating:
                assert_equal(average, sum(ys(6)) / size, dtype, "in-place average " + what)
                assert_equal(scaled, sum(ys(7)), dtype, "in-place scaled allreduce " + what)
            else:
                assert_equal(average, np.max(np.stack(ys(6)), 0), dtype, "in-place max " + what)
                assert_equal(scaled, np.min(np.stack(ys(7)), 0), dtype, "in-place min " + what)


def run_opposite_orders(rank, size):
    """A TF1 graph (a tf.function would chain the two stateful ops in program order)
    with two independent allreduces, built in another order on each rank, run by a
    session with one inter-op thread: each rank's thread drives the engine for the
    op it runs first while the peer's thread drives the other one."""
    xs = [make_array("oo", r, (4,), tf.float32) for r in range(size)]
    order = ["first", "second"] if rank % 2 == 0 else ["second", "first"]
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(xs[rank], tf.float32)
        out = {name: hvd.allreduce(x * (1 if name == "first" else 3), op=hvd.Sum,
                                   name="traced.order." + name) for name in order}
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                      intra_op_parallelism_threads=1)
    seconds, results = [], []
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        for _ in range(8):
            start = time.perf_counter()
            results.append(session.run(out))
            seconds.append(time.perf_counter() - start)
    for got in results:  # numpy arrays, checked outside the session's graph
        assert_equal(got["first"], sum(xs), tf.float32, "first of two in opposite orders")
        assert_equal(got["second"], 3 * sum(xs), tf.float32, "second of two in opposite orders")
    # A graph op gives up driving after GRAPH_DRIVE_S (10 ms); one that drove as
    # long as an eager call (0.5 s) would hold the thread the other op waits for.
    assert np.median(seconds) < 0.25, "calls took %s s" % np.round(seconds, 3)
    log("opposite orders: median %.1f ms per call" % (1e3 * np.median(seconds)))


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    run_no_python_per_call(rank, size)
    log("no Python per call ok")
    run_in_place(rank, size)
    log("in place ok")
    run_opposite_orders(rank, size)
    hvd.shutdown()


main(body)
