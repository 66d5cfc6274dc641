"""Horovod parity of the TensorFlow front end (issue 15), against numpy references:
names that agree when ranks trace differently (a retrace on some ranks only, TF1
graph gradients: these hung before), Horovod's gradient conventions, alltoall's
return value, uint16, broadcast_, the *_op topology ops, tf.IndexedSlices; Horovod's submodule paths;
process sets of per-rank mpi4py communicators."""
import numpy as np
import tensorflow as tf

from common import assert_equal, hvd, log, main, make_array

MODES = ("eager", "function", "graph")


def run(mode, f, *args):
    """f(*args) eagerly, inside a tf.function, or in a TF1 graph run by a Session;
    numpy results (a list stays a list)."""
    if mode == "eager":
        out = f(*[tf.constant(a) for a in args])
    elif mode == "function":
        out = tf.function(f)(*[tf.constant(a) for a in args])
    else:
        with tf.Graph().as_default():
            out = f(*[tf.constant(a) for a in args])
            with tf.compat.v1.Session() as session:
                return session.run(out)
    return [o.numpy() for o in out] if isinstance(out, (list, tuple)) else out.numpy()


def gradient(loss_fn):
    """x -> d loss_fn(x) / dx, written for every mode (tf.gradients in a graph)."""
    def f(x):
        if tf.executing_eagerly():
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = loss_fn(x)
            return tape.gradient(loss, x)
        return tf.gradients(loss_fn(x), x)[0]
    return f


def offsets(rows):
    return [sum(rows[:r]) for r in range(len(rows))]


def run_retrace(rank, size):
    """A tf.function that one rank retraces (its batch has a new shape) must still
    agree with the ranks that reuse their trace: with trace-order names this hung."""
    gather = tf.function(lambda t: hvd.allgather(t))
    for step, rows in enumerate([[r + 1 for r in range(size)],
                                 [5 if r == 0 else r + 1 for r in range(size)],
                                 [r + 1 for r in range(size)]]):
        xs = [make_array("retrace%d" % step, r, (rows[r], 3), tf.float32) for r in range(size)]
        got = gather(tf.constant(xs[rank], tf.float32))
        assert_equal(got, np.concatenate(xs), tf.float32, "retraced allgather step %d" % step)

    # The same with a gradient taken eagerly through the function (its backward
    # function is traced again for the new shape, on rank 0 only).
    @tf.function
    def weighted(t, w):
        return tf.reduce_sum(hvd.allgather(t) * w)
    for step, rows in enumerate([[r + 1 for r in range(size)],
                                 [4 if r == 0 else r + 1 for r in range(size)]]):
        xs = [make_array("rg%d" % step, r, (rows[r], 2), tf.float64) for r in range(size)]
        ws = [make_array("rgw%d" % step, r, (sum(rows), 2), tf.float64) for r in range(size)]
        x = tf.constant(xs[rank])
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = weighted(x, tf.constant(ws[rank]))
        start = offsets(rows)[rank]
        np.testing.assert_allclose(tape.gradient(loss, x).numpy(),
                                   np.mean(ws, axis=0)[start:start + rows[rank]],
                                   err_msg="allgather gradient after a retrace, step %d" % step)


def run_gradients(mode, rank, size):
    """Horovod's conventions: allgather -> average of the upstream gradients, this
    rank's rows; broadcast -> average on the root, zeros elsewhere (in a TF1 graph
    the non-roots pruned their allreduce and the root hung); reducescatter ->
    allgather of the upstream gradients, times the size for Sum."""
    rows = [r + 1 for r in range(size)]  # uneven first dims
    xs = [make_array("gx" + mode, r, (rows[r], 2), tf.float64) for r in range(size)]
    ws = [make_array("gw" + mode, r, (sum(rows), 2), tf.float64) for r in range(size)]
    start = offsets(rows)[rank]
    got = run(mode, gradient(lambda v: tf.reduce_sum(hvd.allgather(v) * ws[rank])), xs[rank])
    np.testing.assert_allclose(got, np.mean(ws, axis=0)[start:start + rows[rank]],
                               err_msg="allgather gradient, uneven dim 0, " + mode)
    # grouped_allgather: each tensor its own rows.
    ys = [make_array("gy" + mode, r, (2 * rows[r], 3), tf.float64) for r in range(size)]
    vs = [make_array("gv" + mode, r, (2 * sum(rows), 3), tf.float64) for r in range(size)]

    def grouped_loss(a, b):
        ga, gb = hvd.grouped_allgather([a, b])
        return tf.reduce_sum(ga * ws[rank]) + tf.reduce_sum(gb * vs[rank])

    def grouped_grads(a, b):
        if not tf.executing_eagerly():
            return tf.gradients(grouped_loss(a, b), [a, b])
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            loss = grouped_loss(a, b)
        return tape.gradient(loss, [a, b])
    ga, gb = run(mode, grouped_grads, xs[rank], ys[rank])
    np.testing.assert_allclose(ga, np.mean(ws, axis=0)[start:start + rows[rank]],
                               err_msg="grouped_allgather gradient [0] " + mode)
    np.testing.assert_allclose(gb, np.mean(vs, axis=0)[2 * start:2 * start + 2 * rows[rank]],
                               err_msg="grouped_allgather gradient [1] " + mode)

    cs = [make_array("gc" + mode, r, (3, 2), tf.float64) for r in range(size)]
    x = make_array("gb" + mode, rank, (3, 2), tf.float64)
    for root in range(size):
        got = run(mode, gradient(lambda v: tf.reduce_sum(hvd.broadcast(v, root) * cs[rank])), x)
        expected = np.mean(cs, axis=0) if rank == root else np.zeros((3, 2))
        np.testing.assert_allclose(got, expected,
                                   err_msg="broadcast gradient, root %d, %s" % (root, mode))

    dim0 = 2 * size + 1  # uneven split: the first ranks get one more row
    out_rows = [dim0 // size + (r < dim0 % size) for r in range(size)]
    us = [make_array("gu" + mode, r, (out_rows[r], 2), tf.float64) for r in range(size)]
    z = make_array("gz" + mode, rank, (dim0, 2), tf.float64)
    for op, scale in ((hvd.Sum, size), (hvd.Average, 1)):
        got = run(mode, gradient(lambda v: tf.reduce_sum(hvd.reducescatter(v, op=op) * us[rank])),
                  z)
        np.testing.assert_allclose(got, np.concatenate(us) * scale,
                                   err_msg="reducescatter gradient op %s %s" % (op, mode))
        got = run(mode, gradient(lambda v: tf.reduce_sum(
            hvd.grouped_reducescatter([v, v * 2], op=op)[1] * us[rank])), z)
        np.testing.assert_allclose(got, 2 * np.concatenate(us) * scale,
                                   err_msg="grouped_reducescatter gradient op %s %s" % (op, mode))
    # grouped_allreduce: the same reduction of the upstream gradients.
    for op, expected in ((hvd.Sum, np.sum(cs, axis=0)), (hvd.Average, np.mean(cs, axis=0))):
        got = run(mode, gradient(lambda v: tf.reduce_sum(
            hvd.grouped_allreduce([v, v], op=op)[1] * cs[rank])), x)
        np.testing.assert_allclose(got, expected,
                                   err_msg="grouped_allreduce gradient op %s %s" % (op, mode))


def run_alltoall(mode, rank, size):
    """Horovod returns the tensor alone without splits, (tensor, received) with."""
    sent = [make_array("a2a" + mode, r, (2 * size, 3), tf.float32) for r in range(size)]
    out = run(mode, lambda t: hvd.alltoall(t), sent[rank].astype(np.float32))
    assert isinstance(out, np.ndarray), type(out)
    np.testing.assert_array_equal(out, np.concatenate([s[2 * rank:2 * rank + 2] for s in sent]))
    splits = [j + 1 for j in range(size)]
    sent = [make_array("a2as" + mode, r, (sum(splits), 3), tf.float32) for r in range(size)]
    out, received = run(mode, lambda t: hvd.alltoall(t, splits=splits),
                        sent[rank].astype(np.float32))
    at = offsets(splits)[rank]
    np.testing.assert_array_equal(out, np.concatenate([s[at:at + rank + 1] for s in sent]))
    assert received.tolist() == [rank + 1] * size, received


def run_uint16(mode, rank, size):
    """uint16, which Horovod's allgather, broadcast and alltoall take (moved as
    16-bit words); allreduce refuses it at the call, as Horovod's."""
    big = 60000  # above int16's range: a sign mix-up would show
    xs = [make_array("u16" + mode, r, (r + 1, 2), tf.int32, 0, 5) + big for r in range(size)]
    x = xs[rank].astype(np.uint16)
    assert_equal(run(mode, lambda t: hvd.allgather(t), x).astype(np.float64),
                 np.concatenate(xs), tf.float64, "allgather uint16 " + mode)
    got = run(mode, lambda t: hvd.grouped_allgather([t, t[:1]]), x)
    assert got[0].dtype == np.uint16 and got[1].dtype == np.uint16, got
    np.testing.assert_array_equal(got[1], np.stack([a[0] for a in xs]))
    ys = [make_array("u16b" + mode, r, (3,), tf.int32, 0, 5) + big for r in range(size)]
    for root in range(size):
        got = run(mode, lambda t: hvd.broadcast(t, root), ys[rank].astype(np.uint16))
        assert got.dtype == np.uint16
        np.testing.assert_array_equal(got, ys[root], err_msg="broadcast uint16 " + mode)
    sent = [make_array("u16a" + mode, r, (size, 2), tf.int32, 0, 5) + big for r in range(size)]
    got = run(mode, lambda t: hvd.alltoall(t), sent[rank].astype(np.uint16))
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, np.stack([s[rank] for s in sent]))
    try:  # TensorFlow's own error for a dtype the op does not list
        run(mode, lambda t: hvd.allreduce(t), x)
    except (TypeError, tf.errors.InvalidArgumentError) as e:
        assert "uint16" in str(e), e
    else:
        raise AssertionError("allreduce of uint16 did not raise")


def run_broadcast_inplace(mode, rank, size):
    """broadcast_(variables, root_rank): root's values assigned in place, returned."""
    root = size - 1
    inits = [make_array("bi%d" % i, rank, shape, tf.float32)
             for i, shape in enumerate([(2, 3), (4,), ()])]
    expected = [make_array("bi%d" % i, root, a.shape, tf.float32) for i, a in enumerate(inits)]
    if mode == "graph":
        with tf.Graph().as_default():
            variables = [tf.compat.v1.Variable(a) for a in inits]
            returned = hvd.broadcast_(variables, root)
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                got = session.run(returned)
                now = session.run(variables)
    else:
        variables = [tf.Variable(a) for a in inits]
        f = (lambda: hvd.broadcast_(variables, root))
        got = [t.numpy() for t in (f() if mode == "eager" else tf.function(f)())]
        now = [v.numpy() for v in variables]
    for g, n, e in zip(got, now, expected):
        np.testing.assert_array_equal(g, e, err_msg="broadcast_ returned " + mode)
        np.testing.assert_array_equal(n, e, err_msg="broadcast_ assigned " + mode)


def run_topology_ops(mode, rank, size):
    """rank_op() and friends are ops evaluated when the graph runs."""
    pset = hvd.add_process_set(list(range(1, size)))
    got = run(mode, lambda: [hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(),
                             hvd.local_size_op(), hvd.size_op(process_set_id=pset.process_set_id),
                             hvd.process_set_included_op(),
                             hvd.process_set_included_op(pset.process_set_id),
                             hvd.process_set_included_op(12345)])
    assert [int(v) for v in got] == [rank, size, hvd.local_rank(), hvd.local_size(), size - 1, 1,
                                     int(rank != 0), -3], (mode, got)
    hvd.remove_process_set(pset)


def run_indexed_slices(mode, rank, size):
    """tf.IndexedSlices: values and indices allgathered (Average divides the values,
    a true division as in Horovod, so integers come back as floats), alone or mixed
    with dense tensors in grouped_allreduce; Horovod's errors for the rest."""
    rows = [r + 1 for r in range(size)]
    vals = [make_array("isv" + mode, r, (rows[r], 3), tf.float32) for r in range(size)]
    idx = [np.arange(rows[r]) % 4 + r for r in range(size)]
    dense = [make_array("isd" + mode, r, (2, 2), tf.float32) for r in range(size)]

    def reduce(op, value_dtype):
        def f(v, i, d):
            s = tf.IndexedSlices(tf.cast(v, value_dtype), i, dense_shape=[8, 3])
            single = hvd.allreduce(s, op=op)
            group = hvd.grouped_allreduce([d, s, s], op=op)
            assert isinstance(single, tf.IndexedSlices) and isinstance(group[1], tf.IndexedSlices)
            return [single.values, single.indices, group[0], group[1].values, group[2].indices]
        return run(mode, f, vals[rank], idx[rank].astype(np.int64), dense[rank])
    for op in (hvd.Sum, hvd.Average):
        for dtype in (tf.float32, tf.int32):
            values, indices, d, gvalues, gindices = reduce(op, dtype)
            expected = np.concatenate(vals) / (size if op == hvd.Average else 1)
            out_dtype = np.float64 if (dtype == tf.int32 and op == hvd.Average) else \
                dtype.as_numpy_dtype
            what = "IndexedSlices op %s %s %s" % (op, dtype.name, mode)
            assert values.dtype == out_dtype and gvalues.dtype == out_dtype, (what, values.dtype)
            np.testing.assert_allclose(values, expected, rtol=1e-6, err_msg=what)
            np.testing.assert_allclose(gvalues, expected, rtol=1e-6, err_msg="grouped " + what)
            np.testing.assert_array_equal(indices, np.concatenate(idx), err_msg=what)
            np.testing.assert_array_equal(gindices, np.concatenate(idx), err_msg=what)
            np.testing.assert_allclose(d, np.sum(dense, 0) / (size if op == hvd.Average else 1),
                                       rtol=1e-6, err_msg="dense beside " + what)
    if mode != "eager":
        return
    s = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([0]), dense_shape=[8, 3])
    for call, text in [(lambda: hvd.allreduce(s, op=hvd.Adasum), "sparse_as_dense"),
                       (lambda: hvd.grouped_allreduce([s], op=hvd.Adasum), "sparse_as_dense"),
                       (lambda: hvd.allreduce(s, op=hvd.Max), "Sum and Average"),
                       (lambda: hvd.grouped_allreduce([tf.ones(2), s], op=hvd.Min),
                        "Sum and Average"),
                       (lambda: hvd.allreduce(s, prescale_factor=2.0), "postscale"),
                       (lambda: hvd.grouped_allreduce([s], postscale_factor=0.5), "postscale")]:
        try:
            call()
        except NotImplementedError as e:
            assert text in str(e), e
        else:
            raise AssertionError("no NotImplementedError (%s)" % text)
    assert hvd.grouped_allreduce([]) == []


def run_group_sizes(rank, size):
    """A grouped call with more tensors on rank 0 fails on every rank (it hung on the
    rank with more), and the same name with one group size everywhere works after."""
    def group(count):
        return [tf.constant(make_array("grp%d" % i, rank, (3,), tf.float32), tf.float32)
                for i in range(count)]
    try:
        hvd.grouped_allreduce(group(3 if rank == 0 else 2), name="tf.grp", op=hvd.Sum)
    except Exception as e:  # a tf.errors error from the op, or Perseus's own
        assert "group size" in str(e), e
    else:
        raise AssertionError("grouped calls of different sizes did not fail")
    outs = hvd.grouped_allreduce(group(3), name="tf.grp", op=hvd.Sum)
    for i, out in enumerate(outs):
        want = sum(make_array("grp%d" % i, r, (3,), tf.float32) for r in range(size))
        assert_equal(out, want, tf.float32, "group after the mismatch")


def run_horovod_modules(rank, size):
    """Horovod's submodule paths (horovod.tensorflow.mpi_ops, ...) hold the package's
    objects; _basics lists the sets; gpu_available is False (CPU tensors only)."""
    import importlib
    for name in ("mpi_ops", "compression", "functions", "gradient_aggregation",
                 "gradient_aggregation_eager", "sync_batch_norm", "util"):
        module = importlib.import_module("perseus.tensorflow.horovod." + name)
        for attr in ("allreduce", "Average", "DistributedGradientTape", "Compression", "size"):
            assert getattr(module, attr) is getattr(hvd, attr), (name, attr)
    from perseus.tensorflow.horovod.elastic import TensorFlowKerasState  # noqa: F401
    from perseus.tensorflow.horovod.mpi_ops import Sum, allreduce
    assert allreduce is hvd.allreduce and Sum is hvd.Sum
    ids = hvd.mpi_ops._basics._get_process_set_ids_and_ranks
    evens = hvd.add_process_set(list(range(0, size, 2)))
    assert ids() == {0: list(range(size)), evens.process_set_id: list(range(0, size, 2))}, ids()
    hvd.remove_process_set(evens)
    assert ids() == {0: list(range(size))}
    assert hvd.gpu_available("tensorflow") is False
    # A set whose id names no registered set: ValueError before anything runs, as
    # Horovod; a registered set this rank is not in: InvalidArgumentError, as Horovod.
    forged = hvd.ProcessSet([0])
    forged.process_set_id = 10
    try:
        hvd.allreduce(tf.ones([2]), process_set=forged, name="forged")
    except ValueError as e:
        assert "is not registered" in str(e), e
    else:
        raise AssertionError("an allreduce on a set with a forged id ran")
    first = hvd.add_process_set([0])
    if rank != 0:
        try:
            hvd.allreduce(tf.ones([2]), process_set=first, name="not_mine")
        except tf.errors.InvalidArgumentError:
            pass
        else:
            raise AssertionError("an allreduce on a set without this rank ran")
    hvd.remove_process_set(first)


def run_communicator_sets(rank, size):
    """Process sets of per-rank mpi4py communicators under TensorFlow (Horovod's cases:
    tests/rank_scripts/init_mpi4py.py): add_process_set(ProcessSet(sub)) registers every
    rank's set, sorted; an allreduce on this rank's."""
    from mpi4py import MPI  # MPI is up: Perseus initialised it

    from perseus.common.process_sets import find_process_set
    sub = MPI.COMM_WORLD.Split(rank % 2, rank)
    mine = hvd.add_process_set(hvd.ProcessSet(sub))
    members = list(range(rank % 2, size, 2))
    others = list(range(1 - rank % 2, size, 2))
    first = min(mine.process_set_id, find_process_set(others).process_set_id)
    assert mine.process_set_id == first + rank % 2, mine  # evens first, as Horovod
    ids = hvd.mpi_ops._basics._get_process_set_ids_and_ranks()
    assert ids == {0: list(range(size)), first: list(range(0, size, 2)),
                   first + 1: list(range(1, size, 2))}, ids
    assert repr(mine) == "ProcessSet(process_set_id=%d, ranks=%s, mpi_comm=%s)" % (
        first + rank % 2, members, sub), repr(mine)
    expected = sum(make_array("commset", r, (3,), tf.float32) for r in members)
    x = tf.constant(make_array("commset", rank, (3,), tf.float32), tf.float32)
    assert_equal(hvd.allreduce(x, op=hvd.Sum, process_set=mine, name="commset"), expected,
                 tf.float32, "communicator set")
    for process_set in (mine, find_process_set(others)):  # every rank removes both
        hvd.remove_process_set(process_set)
    sub.Free()


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    run_horovod_modules(rank, size)
    log("horovod modules ok")
    run_communicator_sets(rank, size)
    log("communicator sets ok")
    run_retrace(rank, size)
    log("retrace ok")
    run_group_sizes(rank, size)
    log("group sizes ok")
    for mode in MODES:
        run_gradients(mode, rank, size)
        run_alltoall(mode, rank, size)
        run_uint16(mode, rank, size)
        run_broadcast_inplace(mode, rank, size)
        run_topology_ops(mode, rank, size)
        run_indexed_slices(mode, rank, size)
        log(mode, "ok")
    # The engine still works after the refused calls.
    assert_equal(hvd.allreduce(tf.ones([2]), op=hvd.Sum), np.full(2, size), tf.float32, "after")
    hvd.shutdown()


main(body)
