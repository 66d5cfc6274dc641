"""Data-parallel training equals single-process training on the whole batch (float64):
  * DistributedGradientTape, eagerly and inside tf.function; its options (groups as
    lists and as a count, num_groups with Horovod's DeprecationWarning, Sum, predivide,
    fp16, sparse gradients with and without sparse_as_dense; groups <= 0 and a
    predivide with Sum refused at construction) and PartialDistributedGradientTape;
  * Keras model.fit with DistributedOptimizer + BroadcastGlobalVariablesCallback,
    ranks starting from different weights; MetricAverageCallback;
    load_model re-wraps the saved optimizer (training goes on as the reference);
    SyncBatchNormalization against BatchNormalization on the whole batch;
  * a TF1 graph with DistributedOptimizer, MonitoredTrainingSession and
    BroadcastGlobalVariablesHook (ranks start different, end identical); the TF1
    optimizer's register_local_var and scale_local_gradients.
Each rank trains on its slice of a global batch; the reference runs the whole batch
through plain TensorFlow in the same process."""
import os
import warnings

import numpy as np
import tensorflow as tf

from common import hvd, log, main
from tiny_model import forward, init_weights, keras_model

import perseus.tensorflow.keras as hvd_keras

STEPS = 4
LR = 0.125  # exact in float32: Keras 3 keeps the learning rate as a float32 variable


def data(size, rows_per_rank=3):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(rows_per_rank * size, 5))
    y = rng.normal(size=(rows_per_rank * size, 2))
    return x, y


def reference(x, y, steps=STEPS):
    ws = [tf.Variable(w) for w in init_weights(0)]
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((forward(ws, x) - y) ** 2)
        for w, g in zip(ws, tape.gradient(loss, ws)):
            w.assign_sub(LR * g)
    return [w.numpy() for w in ws]


def check_tape(rank, size, x, y, expected):
    part = slice(3 * rank, 3 * rank + 3)
    for mode in ("eager", "function"):
        ws = [tf.Variable(w) for w in init_weights(0)]

        def step(xs, ys):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((forward(ws, xs) - ys) ** 2)
            tape = hvd.DistributedGradientTape(tape)
            for w, g in zip(ws, tape.gradient(loss, ws)):
                w.assign_sub(LR * g)
        if mode == "function":
            step = tf.function(step)
        for _ in range(STEPS):
            step(tf.constant(x[part]), tf.constant(y[part]))
        for w, e in zip(ws, expected):
            np.testing.assert_allclose(w.numpy(), e, rtol=1e-10, atol=1e-12,
                                       err_msg="DistributedGradientTape " + mode)
    log("tape ok")


def check_tape_options(rank, size):
    """Each option against per-rank gradients gathered with allgather_object."""
    ws = [tf.Variable(w) for w in init_weights(0)]
    x = tf.constant(make_rows(rank))

    def grads(**kwargs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(forward(ws, x) ** 2)
        if kwargs.pop("plain", False):
            return [g.numpy() for g in tape.gradient(loss, ws)]
        tape = hvd.DistributedGradientTape(tape, **kwargs)
        return [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, ws)]
    local = grads(plain=True)
    every = hvd.allgather_object(local)
    mean = [np.mean([e[i] for e in every], axis=0) for i in range(len(ws))]
    total = [np.sum([e[i] for e in every], axis=0) for i in range(len(ws))]
    for kwargs, expected, tol in [({}, mean, 1e-12), ({"num_groups": 2}, mean, 1e-12),
                                  ({"groups": 2}, mean, 1e-12),
                                  ({"groups": [[ws[0], ws[2]]]}, mean, 1e-12),
                                  ({"op": hvd.Sum}, total, 1e-12),
                                  ({"gradient_predivide_factor": 2.0}, mean, 1e-12),
                                  ({"compression": hvd.Compression.fp16}, mean, 1e-2)]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = grads(**kwargs)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=str(kwargs))
        # num_groups is Horovod's deprecated spelling of groups.
        deprecated = [w for w in caught if w.category is DeprecationWarning and
                      "`num_groups` has been replaced by `groups`" in str(w.message)]
        assert len(deprecated) == ("num_groups" in kwargs), (kwargs, caught)
    # Sources as a tuple: a list back, as Horovod's tape gives (TensorFlow's: a tuple).
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(forward(ws, x) ** 2)
    got = hvd.DistributedGradientTape(tape).gradient(loss, tuple(ws))
    assert type(got) is list, type(got)
    for g, e in zip(got, mean):
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), e, rtol=1e-12, atol=1e-12)
    # Refused where the tape is made, as Horovod: groups of 0 or less, and a
    # predivide factor with op=Sum.
    for kwargs, text in (({"groups": 0}, "groups should be"), ({"groups": -1}, "groups should be"),
                         ({"op": hvd.Sum, "gradient_predivide_factor": 2.0},
                          "gradient_predivide_factor not supported")):
        try:
            hvd.DistributedGradientTape(tf.GradientTape(), **kwargs)
            raise AssertionError("DistributedGradientTape(%s) was accepted" % kwargs)
        except ValueError as e:
            assert text in str(e), (kwargs, e)
    # Sparse gradients (tf.gather): allgathered, or densified with sparse_as_dense.
    table = tf.Variable(np.arange(30, dtype=np.float64).reshape(10, 3))
    ids = tf.constant([rank, rank + 1, 7])

    def sparse_grad(**kwargs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids) * (rank + 1.0))
        tape = hvd.DistributedGradientTape(tape, **kwargs)
        return tape.gradient(loss, [table])[0]
    expected = np.zeros((10, 3))
    for r in range(size):
        for i in (r, r + 1, 7):
            expected[i] += (r + 1.0) / size
    got = sparse_grad()
    assert isinstance(got, tf.IndexedSlices), type(got)
    np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), expected, err_msg="sparse")
    got = sparse_grad(sparse_as_dense=True)
    assert not isinstance(got, tf.IndexedSlices)
    np.testing.assert_allclose(got.numpy(), expected, err_msg="sparse_as_dense")
    # PartialDistributedGradientTape: the local layer's gradient stays this rank's own,
    # divided by the size (Horovod's scale_local_gradients) unless asked not to.
    layers = [tf.keras.layers.Dense(3, dtype="float64"), tf.keras.layers.Dense(1, dtype="float64")]
    model = tf.keras.Sequential([tf.keras.Input((5,))] + layers)
    for v in model.variables:
        v.assign(tf.ones_like(v) * 0.1)
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    own = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
    every = hvd.allgather_object(own)
    for scale, local_factor in ((True, 1.0 / size), (False, 1.0)):
        partial = hvd.PartialDistributedGradientTape(tape, local_layers=layers[0],
                                                     scale_local_gradients=scale)
        got = [g.numpy() for g in partial.gradient(loss, model.trainable_variables)]
        for i, g in enumerate(got):
            expected = own[i] * local_factor if i < 2 else np.mean([e[i] for e in every], axis=0)
            np.testing.assert_allclose(g, expected, rtol=1e-12,
                                       err_msg="partial tape %d scale=%s" % (i, scale))
    log("tape options ok")


def make_rows(rank):
    return np.random.default_rng(100 + rank).normal(size=(4, 5))


def check_keras(rank, size, x, y, expected):
    part = slice(3 * rank, 3 * rank + 3)
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":  # the run that tests Keras 2 (tf-keras)
        assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__
    tf.keras.backend.set_floatx("float64")  # else fit() casts the float64 data to float32
    model = keras_model(seed=rank)  # only rank 0 starts from the reference weights
    opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=LR))
    model.compile(optimizer=opt, loss="mse")
    history = model.fit(x[part], y[part], batch_size=3, epochs=STEPS, shuffle=False, verbose=0,
                        callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd_keras.callbacks.MetricAverageCallback()])
    got = [model.layers[0].kernel.numpy(), model.layers[0].bias.numpy(),
           model.layers[1].kernel.numpy()]
    for w, e in zip(got, expected):
        np.testing.assert_allclose(w, e, rtol=1e-10, atol=1e-12, err_msg="Keras fit")
    # The averaged loss is the same number on every rank.
    losses = hvd.allgather_object(history.history["loss"][-1])
    assert all(l == losses[0] for l in losses), losses
    # ... and the mean of the ranks' own values, numeric ones only, as numpy scalars.
    logs = {"loss": 0.5 * rank + 1, "acc": np.float32(rank), "lr_name": "sgd"}
    hvd_keras.callbacks.MetricAverageCallback().on_epoch_end(STEPS, logs)
    assert logs["lr_name"] == "sgd", logs
    for key, own in (("loss", lambda r: 0.5 * r + 1), ("acc", float)):
        np.testing.assert_allclose(logs[key].item(), np.mean([own(r) for r in range(size)]),
                                   rtol=1e-15, err_msg=key)
    # load_model restores the optimizer, state included, as a DistributedOptimizer:
    # one more epoch on the reloaded model equals one more reference step.
    path = os.path.join(os.environ["PTEST_TMPDIR"], "model.keras")
    if rank == 0:
        model.save(path)
    hvd.barrier()
    loaded = hvd_keras.load_model(path)
    assert "_perseus_reduce_args" in vars(type(loaded.optimizer)), type(loaded.optimizer)
    assert int(loaded.optimizer.iterations.numpy()) == STEPS
    loaded.fit(x[part], y[part], batch_size=3, epochs=1, shuffle=False, verbose=0)
    got = [loaded.layers[0].kernel.numpy(), loaded.layers[0].bias.numpy(),
           loaded.layers[1].kernel.numpy()]
    for w, e in zip(got, reference(tf.constant(x), tf.constant(y), STEPS + 1)):
        np.testing.assert_allclose(w, e, rtol=1e-10, atol=1e-12, err_msg="after load_model")
    hvd.barrier()
    log("keras ok")


def check_sync_batch_norm(rank, size):
    """Outputs, moving statistics and gradients equal BatchNormalization on the
    concatenated batch (each rank holds 3 rows of a 3 * size batch)."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3 * size, 4)) * 2 + 1
    part = slice(3 * rank, 3 * rank + 3)
    # One layer under both names, as Horovod's; fused=False accepted (Keras 3 has no such
    # argument: it is not passed on), fused=True refused.
    assert hvd.SyncBatchNormalization is hvd_keras.SyncBatchNormalization
    try:
        hvd.SyncBatchNormalization(fused=True)
    except ValueError as e:
        assert "fused=True" in str(e), e
    else:
        raise AssertionError("SyncBatchNormalization(fused=True) was accepted")
    sync = hvd.SyncBatchNormalization(fused=False, momentum=0.5, dtype="float64")
    plain = tf.keras.layers.BatchNormalization(momentum=0.5, dtype="float64")
    sync.build((None, 4))
    plain.build((None, 4))
    weights = rng.normal(size=(3 * size, 4))
    with tf.GradientTape() as tape:
        out = sync(tf.constant(x[part]), training=True)
        loss = tf.reduce_sum(out * weights[part])
    grads = tape.gradient(loss, [sync.gamma, sync.beta])
    grads = [hvd.allreduce(g, op=hvd.Sum) for g in grads]  # the global loss's gradient
    with tf.GradientTape() as tape:
        ref = plain(tf.constant(x), training=True)
        ref_loss = tf.reduce_sum(ref * weights)
    ref_grads = tape.gradient(ref_loss, [plain.gamma, plain.beta])
    np.testing.assert_allclose(out.numpy(), ref.numpy()[part], rtol=1e-6, atol=1e-9,
                               err_msg="SyncBatchNormalization output")
    for a, b in zip([sync.moving_mean, sync.moving_variance],
                    [plain.moving_mean, plain.moving_variance]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9,
                                   err_msg="moving statistics")
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-6, atol=1e-9,
                                   err_msg="SyncBatchNormalization gradient")
    log("sync batch norm ok")


def check_tf1_values(rank, size, x, y, expected):
    part = slice(3 * rank, 3 * rank + 3)
    graph = tf.Graph()
    with graph.as_default():
        v1 = tf.compat.v1
        ws = [v1.get_variable("w%d" % i, initializer=w, dtype=tf.float64)
              for i, w in enumerate(init_weights(seed=rank))]
        loss = tf.reduce_mean((forward(ws, tf.constant(x[part])) - tf.constant(y[part])) ** 2)
        global_step = v1.train.get_or_create_global_step()
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(LR))
        train_op = opt.minimize(loss, global_step=global_step)
        hooks = [hvd.BroadcastGlobalVariablesHook(0)]
        with v1.train.MonitoredTrainingSession(checkpoint_dir=None, hooks=hooks) as sess:
            for _ in range(STEPS):
                sess.run(train_op)
            got = sess.run(ws)
    for w, e in zip(got, expected):
        np.testing.assert_allclose(w, e, rtol=1e-10, atol=1e-12, err_msg="TF1 session")
    everyone = hvd.allgather_object([w.tobytes() for w in got])
    assert all(e == everyone[0] for e in everyone), "ranks ended with different variables"
    log("tf1 ok")


def check_tf1_local_vars(rank, size):
    """The TF1 DistributedOptimizer's register_local_var (eagerly): that variable's
    gradient stays this rank's, divided by the size unless scale_local_gradients=False;
    the others are averaged."""
    for scale in (True, False):
        local, shared = tf.Variable(np.zeros(3)), tf.Variable(np.zeros(3))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0),
                                       scale_local_gradients=scale)
        opt.register_local_var(local)
        weight = rank + 1.0
        pairs = opt.compute_gradients(lambda: tf.reduce_sum((local + shared) * weight),
                                      var_list=[local, shared])
        opt.apply_gradients(pairs)
        np.testing.assert_allclose(local.numpy(), -weight / (size if scale else 1.0),
                                   err_msg="local variable, scale=%s" % scale)
        np.testing.assert_allclose(shared.numpy(), -(size + 1) / 2.0,
                                   err_msg="shared variable, scale=%s" % scale)
    log("tf1 local variables ok")


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x, y = data(size)
    expected = reference(tf.constant(x), tf.constant(y))
    check_tape(rank, size, x, y, expected)
    check_tape_options(rank, size)
    check_keras(rank, size, x, y, expected)
    check_sync_batch_norm(rank, size)
    check_tf1_values(rank, size, x, y, expected)
    check_tf1_local_vars(rank, size)
    hvd.shutdown()


main(body)
