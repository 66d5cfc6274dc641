"""Every collective x dtype, eagerly and inside tf.function, against numpy
references; grouped variants; process sets; gradients of allreduce, allgather,
broadcast, reducescatter and alltoall against analytic references; barrier/join;
op=Adasum (collectives, DistributedGradientTape, Keras DistributedOptimizer) against
tests/support/adasum_reference.py; errors raised as TensorFlow errors on every rank, after
which the engine works."""
import zlib

import numpy as np
import tensorflow as tf

from common import DTYPES, FLOAT_DTYPES, assert_equal, hvd, log, main, make_array, reduce_ref
from support.adasum_reference import adasum, assert_adasum_close  # tests/, on the path via common

OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def run_collectives(mode, rank, size):
    """mode 'eager' calls the ops directly, 'function' inside one tf.function."""
    wrap = (lambda f: f) if mode == "eager" else tf.function
    for dtype in DTYPES:
        dn = "%s.%s" % (mode, dtype.name)
        xs = [make_array("ar" + dn, r, (3, 4), dtype) for r in range(size)]
        x = tf.cast(xs[rank], dtype)

        @wrap
        def reduces(t):
            return [hvd.allreduce(t, op=op) for op in OPS]
        for op, got in zip(OPS, reduces(x)):
            assert_equal(got, reduce_ref(xs, op, dtype), dtype, "allreduce %s %s" % (op, dn))
        # Named, with scaling (floats): (2 * sum) * 0.5.
        if dtype in FLOAT_DTYPES:
            got = wrap(lambda t: hvd.allreduce(t, op=hvd.Sum, name="scaled." + dn,
                                               prescale_factor=2.0, postscale_factor=0.5))(x)
            assert_equal(got, reduce_ref(xs, hvd.Sum, dtype), dtype, "scaled allreduce " + dn)

        # allgather: rank r contributes r + 1 rows.
        gs = [make_array("ag" + dn, r, (r + 1, 2), dtype) for r in range(size)]
        got = wrap(lambda t: hvd.allgather(t))(tf.cast(gs[rank], dtype))
        assert_equal(got, np.concatenate(gs), dtype, "allgather " + dn)

        # broadcast from every root.
        @wrap
        def broadcasts(t):
            return [hvd.broadcast(t, root) for root in range(size)]
        for root, got in enumerate(broadcasts(x)):
            assert_equal(got, xs[root], dtype, "broadcast root %d %s" % (root, dn))

        # reducescatter with an uneven first dimension.
        dim0 = 2 * size + 1
        rs = [make_array("rs" + dn, r, (dim0, 3), dtype) for r in range(size)]
        rows = [dim0 // size + (r < dim0 % size) for r in range(size)]
        start = sum(rows[:rank])
        got = wrap(lambda t: hvd.reducescatter(t, op=hvd.Sum))(tf.cast(rs[rank], dtype))
        assert_equal(got, reduce_ref(rs, hvd.Sum, dtype)[start:start + rows[rank]], dtype,
                     "reducescatter " + dn)

        # alltoall: rank r sends (j + 1) rows to rank j.
        splits = [j + 1 for j in range(size)]
        sent = [make_array("a2a" + dn, r, (sum(splits), 2), dtype) for r in range(size)]
        got, received = wrap(lambda t: hvd.alltoall(t, splits=splits))(tf.cast(sent[rank], dtype))
        offset = sum(splits[:rank])
        expected = np.concatenate([s[offset:offset + splits[rank]] for s in sent])
        assert_equal(got, expected, dtype, "alltoall " + dn)
        assert received.numpy().tolist() == [rank + 1] * size, received

    # Grouped ops, mixed dtypes, as one unit.
    arrays = [[make_array("g%d" % i, r, (i + 1, 2), d) for r in range(size)]
              for i, d in enumerate([tf.float32, tf.int32, tf.float64])]
    tensors = [tf.cast(a[rank], d) for a, d in zip(arrays, [tf.float32, tf.int32, tf.float64])]
    got = wrap(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum))(tensors)
    for g, a, t in zip(got, arrays, tensors):
        assert_equal(g, reduce_ref(a, hvd.Sum, t.dtype), t.dtype, "grouped_allreduce " + mode)
    got = wrap(lambda ts: hvd.grouped_allgather(ts))(tensors)
    for g, a, t in zip(got, arrays, tensors):
        assert_equal(g, np.concatenate(a), t.dtype, "grouped_allgather " + mode)
    got = wrap(lambda ts: hvd.grouped_reducescatter(ts, op=hvd.Sum))(
        [tf.cast(tf.tile(t, [size, 1]), t.dtype) for t in tensors])
    for g, a, t in zip(got, arrays, tensors):
        assert_equal(g, reduce_ref(a, hvd.Sum, t.dtype), t.dtype, "grouped_reducescatter " + mode)
    # bool: allgather and broadcast move it.
    b = tf.constant([rank % 2 == 0, True])
    assert_equal(wrap(lambda t: hvd.allgather(t))(b),
                 np.array([[r % 2 == 0, True] for r in range(size)]).ravel(), tf.bool,
                 "allgather bool")
    # Compression.fp16: float32 in, float32 out.
    got = wrap(lambda t: hvd.allreduce(t, op=hvd.Sum, compression=hvd.Compression.fp16))(
        tf.cast(xs[rank], tf.float32))
    assert_equal(got, reduce_ref(xs, hvd.Sum, tf.float32), tf.float32, "fp16 compression")


def run_gradients(mode, rank, size):
    wrap = (lambda f: f) if mode == "eager" else tf.function
    cs = [make_array("c" + mode, r, (3, 2), tf.float64) for r in range(size)]
    c = tf.constant(cs[rank])
    x = tf.constant(make_array("x" + mode, rank, (3, 2), tf.float64))

    def grad_of(f):
        @wrap
        def g(v):
            with tf.GradientTape() as tape:
                tape.watch(v)
                loss = f(v)
            return tape.gradient(loss, v)
        return g(x).numpy()

    # loss_r = sum(allreduce(x) * c_r): d/dx_r sum_q loss_q = op-reduction of c.
    total = np.sum(cs, axis=0)
    np.testing.assert_allclose(grad_of(lambda v: tf.reduce_sum(hvd.allreduce(v, op=hvd.Sum) * c)),
                               total, err_msg="allreduce Sum gradient " + mode)
    np.testing.assert_allclose(grad_of(lambda v: tf.reduce_sum(hvd.allreduce(v) * c)),
                               total / size, err_msg="allreduce Average gradient " + mode)
    # allgather: rank r owns rows [3r, 3r + 3) of the output; Horovod averages the
    # upstream gradients.
    ws = [make_array("w" + mode, r, (3 * size, 2), tf.float64) for r in range(size)]
    w = tf.constant(ws[rank])
    np.testing.assert_allclose(grad_of(lambda v: tf.reduce_sum(hvd.allgather(v) * w)),
                               np.mean(ws, axis=0)[3 * rank:3 * rank + 3],
                               err_msg="allgather gradient " + mode)
    # broadcast from the last rank: only the root's input gets a gradient, the
    # average of the upstream ones (Horovod's convention).
    root = size - 1
    expected = total / size if rank == root else np.zeros_like(total)
    np.testing.assert_allclose(grad_of(lambda v: tf.reduce_sum(hvd.broadcast(v, root) * c)),
                               expected, err_msg="broadcast gradient " + mode)
    # reducescatter (Sum): input row i goes to rank i // rows, scaled by its weight
    # and, Horovod's convention, by the set's size.
    rows = 3 // size if size <= 3 else 0
    if 3 % size == 0:
        gs = [make_array("rsg" + mode, r, (rows, 2), tf.float64) for r in range(size)]
        np.testing.assert_allclose(
            grad_of(lambda v: tf.reduce_sum(hvd.reducescatter(v, op=hvd.Sum) * gs[rank])),
            np.concatenate(gs) * size, err_msg="reducescatter gradient " + mode)
    # alltoall (even split of 3 * size rows): the gradient flows back to the sender.
    y = tf.constant(make_array("y" + mode, rank, (size, 2), tf.float64))
    vs = [make_array("v" + mode, r, (size, 2), tf.float64) for r in range(size)]

    @wrap
    def a2a_grad(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            out = hvd.alltoall(t)
            loss = tf.reduce_sum(out * vs[rank])
        return tape.gradient(loss, t)
    # Row j of rank r goes to rank j, arriving as row r there.
    expected = np.stack([vs[j][rank] for j in range(size)])
    np.testing.assert_allclose(a2a_grad(y).numpy(), expected, err_msg="alltoall gradient " + mode)


def normal_array(tag, rank, shape):
    rng = np.random.default_rng(zlib.crc32(("%s|%d" % (tag, rank)).encode()))
    return rng.normal(0, 3, size=shape)


def run_adasum(mode, rank, size):
    wrap = (lambda f: f) if mode == "eager" else tf.function
    for dtype in FLOAT_DTYPES:
        for shape in [(3, 4), (), (0,), (17,)]:
            what = "adasum %s %s %s" % (mode, dtype.name, shape)
            xs = [normal_array(what, r, shape) for r in range(size)]
            got = wrap(lambda t: hvd.allreduce(t, op=hvd.Adasum))(tf.cast(xs[rank], dtype))
            assert got.dtype == dtype, what
            assert_adasum_close(tf.cast(got, tf.float64).numpy(), xs, dtype.name, what)
        what = "adasum scaled %s %s" % (mode, dtype.name)
        xs = [normal_array(what, r, (6,)) for r in range(size)]
        got = wrap(lambda t: hvd.allreduce(t, op=hvd.Adasum, name=what.replace(" ", "."),
                                           prescale_factor=0.5, postscale_factor=4.0))(
            tf.cast(xs[rank], dtype))
        assert_adasum_close(tf.cast(got, tf.float64).numpy(), xs, dtype.name, what,
                            prescale=0.5, postscale=4.0)
    # Grouped: one fused batch, each tensor with its own dot products.
    shapes = [(5,), (2, 3), (), (40,)]
    groups = [[normal_array("adasum.g%d.%s" % (i, mode), r, s) for r in range(size)]
              for i, s in enumerate(shapes)]
    got = wrap(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Adasum))(
        [tf.constant(g[rank], tf.float32) for g in groups])
    for i, (out, xs) in enumerate(zip(got, groups)):
        assert_adasum_close(out.numpy(), xs, "float32", "grouped adasum %s [%d]" % (mode, i))

    # DistributedGradientTape(op=Adasum): loss = sum(v * c_r) has gradient c_r on rank r.
    cs = [normal_array("adasum.tape." + mode, r, (3, 2)) for r in range(size)]
    v = tf.Variable(tf.zeros((3, 2), tf.float64))

    @wrap
    def tape_grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * tf.constant(cs[rank]))
        tape = hvd.DistributedGradientTape(tape, op=hvd.Adasum)
        return tape.gradient(loss, [v])[0]
    assert_adasum_close(tape_grad().numpy(), cs, "float64", "DistributedGradientTape Adasum " + mode)

    # The gradient of an Adasum allreduce is refused (Adasum is not linear).
    try:
        with tf.GradientTape() as tape:
            x = tf.constant(cs[rank])
            tape.watch(x)
            loss = tf.reduce_sum(hvd.allreduce(x, op=hvd.Adasum))
        tape.gradient(loss, x)
    except NotImplementedError as e:
        assert "Adasum" in str(e), str(e)
    else:
        raise AssertionError("the gradient of an Adasum allreduce did not raise")


def run_adasum_keras(rank, size):
    # Keras DistributedOptimizer(op=Adasum): plain SGD with lr 1 moves the variable by
    # minus the Adasum of the ranks' gradients.
    gs = [normal_array("adasum.keras", r, (4,)) for r in range(size)]
    import perseus.tensorflow.keras as hvd_keras
    var = tf.Variable(tf.zeros(4, tf.float64))
    opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=1.0),
                                         op=hvd.Adasum)
    opt.apply_gradients([(tf.constant(gs[rank]), var)])
    np.testing.assert_allclose(var.numpy(), -adasum(gs), rtol=1e-12, atol=1e-12,
                               err_msg="Keras DistributedOptimizer Adasum")


def run_process_sets(rank, size):
    members = list(range(1, size))
    pset = hvd.add_process_set(members)
    xs = {r: make_array("ps", r, (4,), tf.float32) for r in members}
    if rank in members:
        got = hvd.allreduce(tf.constant(xs[rank], tf.float32), op=hvd.Sum, process_set=pset)
        assert_equal(got, sum(xs.values()), tf.float32, "allreduce on a process set")
        got = tf.function(lambda t: hvd.broadcast(t, size - 1, process_set=pset))(
            tf.constant(xs[rank], tf.float32))
        assert_equal(got, xs[size - 1], tf.float32, "broadcast on a process set")
        # Horovod's positional order, ignore_name_scope included (it changes nothing).
        t = tf.constant(xs[rank], tf.float32)
        none = hvd.Compression.none
        order = [r for r in range(size) if r in members]
        assert_equal(hvd.allgather(t, "pos.ag", False, pset), np.concatenate(
            [xs[r] for r in order]), tf.float32, "allgather(t, name, ignore, set)")
        assert_equal(hvd.grouped_allgather([t], "pos.gag", True, pset)[0], np.concatenate(
            [xs[r] for r in order]), tf.float32, "grouped_allgather(ts, name, ignore, set)")
        assert_equal(hvd.broadcast(t, size - 1, "pos.b", False, pset), xs[size - 1], tf.float32,
                     "broadcast(t, root, name, ignore, set)")
        assert_equal(hvd.alltoall(tf.tile(t, [len(members)]), None, "pos.a2a", False, pset),
                     np.concatenate([xs[r] for r in order]), tf.float32,
                     "alltoall(t, splits, name, ignore, set)")
        total = sum(xs.values())
        assert_equal(hvd.allreduce(t, None, '', '', none, hvd.Sum, 1.0, 1.0, "pos.ar", pset, True),
                     total, tf.float32, "allreduce(..., name, set, ignore)")
        assert_equal(hvd.grouped_allreduce([t], None, '', '', none, hvd.Sum, 1.0, 1.0, pset, True,
                                           "pos.gar")[0], total, tf.float32,
                     "grouped_allreduce(..., set, ignore, name)")
        rows = tf.tile(t, [len(members)])
        mine = order.index(rank)
        expected = np.tile(total, len(members))[mine * 4:(mine + 1) * 4]
        assert_equal(hvd.reducescatter(rows, '', none, hvd.Sum, "pos.rs", pset, True), expected,
                     tf.float32, "reducescatter(..., name, set, ignore, ...)")
        assert_equal(hvd.grouped_reducescatter([rows], '', none, hvd.Sum, pset)[0], expected,
                     tf.float32, "grouped_reducescatter(..., op, set)")
        hvd.barrier(process_set=pset)
    hvd.barrier()
    hvd.remove_process_set(pset)


def run_errors(rank, size):
    # Shape mismatch: a TensorFlow error on every rank, naming the tensor.
    for mode in ("eager", "function"):
        f = (lambda t: hvd.allreduce(t, name="mismatch." + mode))
        if mode == "function":
            f = tf.function(f)
        try:
            f(tf.ones([rank + 1]))
        except tf.errors.FailedPreconditionError as e:
            assert "mismatch." + mode in str(e), str(e)
        else:
            raise AssertionError("a shape mismatch did not raise (%s)" % mode)
    try:
        hvd.allreduce(tf.ones([2], dtype=tf.float32 if rank == 0 else tf.float64), name="dt")
    except tf.errors.FailedPreconditionError as e:
        assert "allreduce.dt" in str(e), str(e)
    else:
        raise AssertionError("a dtype mismatch did not raise")
    for call, exc in [(lambda: hvd.allreduce(tf.constant([True])), ValueError),
                      (lambda: hvd.allreduce(tf.ones(2, tf.int32), op=hvd.Adasum), ValueError),
                      (lambda: hvd.reducescatter(tf.ones(2), op=hvd.Adasum), NotImplementedError),
                      (lambda: hvd.allreduce(tf.ones(2), process_set=hvd.ProcessSet([0])),
                       ValueError),
                      (lambda: hvd.allgather(tf.constant(["a"])), tf.errors.InvalidArgumentError)]:
        try:
            call()
        except exc:
            pass
        else:
            raise AssertionError("no %s" % (exc,))
    # A GPU tensor (tensorflow-cpu has none: a stand-in with a GPU device string) is
    # refused at the call, before anything is sent.
    from perseus.tensorflow import mpi_ops

    class OnGpu:
        device = "/job:localhost/replica:0/task:0/device:GPU:0"
    try:
        mpi_ops._cpu_only([tf.ones(1), OnGpu()])
    except NotImplementedError as e:
        assert "GPU:0" in str(e), str(e)
    else:
        raise AssertionError("a GPU tensor was not refused")
    mpi_ops._cpu_only([tf.ones(1)])  # a CPU tensor passes
    # The engine still works.
    assert_equal(hvd.allreduce(tf.ones([2]), op=hvd.Sum), np.full(2, size), tf.float32, "after errors")


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert hvd.is_initialized() and hvd.is_homogeneous()
    assert 0 <= hvd.local_rank() < hvd.local_size()
    for mode in ("eager", "function"):
        run_collectives(mode, rank, size)
        log(mode, "collectives ok")
        run_gradients(mode, rank, size)
        log(mode, "gradients ok")
        run_adasum(mode, rank, size)
        log(mode, "adasum ok")
    run_adasum_keras(rank, size)
    run_process_sets(rank, size)
    assert hvd.broadcast_object({"from": rank}, root_rank=size - 1) == {"from": size - 1}
    assert hvd.allgather_object(rank * 10) == [r * 10 for r in range(size)]
    # Horovod's argument order: (obj, root_rank, session, name), (obj, session, name)
    assert hvd.broadcast_object([rank], 1, None, "bcast.positional") == [1]
    assert hvd.allgather_object(-rank, None, "gather.positional") == [-r for r in range(size)]
    bcast = hvd.broadcast_object_fn(root_rank=size - 1, name="bcast.fn")
    assert [bcast(("step", rank, i)) for i in range(2)] == [("step", size - 1, 0),
                                                            ("step", size - 1, 1)]
    hvd.barrier()
    assert int(hvd.join()) in range(size)
    run_errors(rank, size)
    hvd.shutdown()
    hvd.init()
    assert_equal(hvd.allreduce(tf.ones([1]), op=hvd.Sum), [size], tf.float32, "after re-init")
    hvd.shutdown()


main(body)
