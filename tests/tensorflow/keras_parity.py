"""Horovod parity of the Keras front end (issue 15), against numpy references:
Horovod's names in horovod.tensorflow.keras, BroadcastGlobalVariablesCallback(local_variables=...),
PartialDistributedOptimizer and register_local_var (local gradients divided by the size unless
scale_local_gradients=False), PartialDistributedGradientTape's
get_local_and_global_gradients (issue 40; Keras 3 and tf-keras layers in every run), and under Keras 2 (TF_USE_LEGACY_KERAS=1) the
DistributedOptimizer over tf.keras.optimizers.legacy optimizers, `lr=` spelling
included, and Horovod's _compute_gradients / _agg_helper hooks. Runs under Keras 3 and, from tests/frameworks/test_tensorflow.py, Keras 2.
Also Horovod's rules (horovod/tensorflow and horovod/_keras, 0.28): the TF module's
DistributedOptimizer hands a Keras optimizer to the Keras one; the Keras optimizer takes
op Average or Sum, groups as a count or lists, num_groups with a DeprecationWarning;
LearningRateScheduleCallback's number multiplier decays exponentially, and both lr
callbacks log "lr"; the Keras module's collectives take Horovod's Keras arguments."""
import warnings
import os

import numpy as np
import tensorflow as tf

from common import hvd as tfhvd, log, main, make_array

import perseus.tensorflow.keras as hvd

LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"


def model_of(rank):
    """Two Dense layers with weights that differ by rank."""
    layers = [tf.keras.layers.Dense(3), tf.keras.layers.Dense(1)]
    model = tf.keras.Sequential([tf.keras.Input((4,))] + layers)
    for i, v in enumerate(model.variables):
        v.assign(make_array("w%d" % i, rank, tuple(v.shape), tf.float32))
    return model, layers


def as_ref(v):
    """How Horovod's callers name a variable in a set: its .ref(); a Keras 3 variable
    has none, so the .ref() of the tf.Variable inside it."""
    return v.ref() if hasattr(v, "ref") else v.value.ref()


def check_broadcast_callback(rank, size, refs=False):
    root = size - 1
    model, layers = model_of(rank)
    before = [v.numpy() for v in model.variables]
    roots = [make_array("w%d" % i, root, b.shape, tf.float32) for i, b in enumerate(before)]
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.0)), loss="mse")
    local = list(layers[0].trainable_weights)
    callback = hvd.callbacks.BroadcastGlobalVariablesCallback(
        root, local_variables=[as_ref(v) for v in local] if refs else local)
    model.fit(np.ones((2, 4)), np.ones((2, 1)), batch_size=2, epochs=1, verbose=0,
              callbacks=[callback])
    for i, v in enumerate(model.variables):  # lr 0: only the broadcast changed them
        expected = before[i] if i < len(local) else roots[i]
        np.testing.assert_array_equal(v.numpy(), expected, err_msg="variable %d" % i)


def check_partial_optimizer(rank, size):
    """Plain SGD with lr 1 moves each variable by minus its (reduced) gradient."""
    gs = [[make_array("pg%d" % i, r, shape, tf.float32) for r in range(size)]
          for i, shape in enumerate([(4, 3), (3,), (3, 1), (1,)])]
    for scale_local, local_factor in ((True, 1.0 / size), (False, 1.0)):
        for via in ("partial", "register", "register_ref"):
            model, layers = model_of(rank)
            start = [v.numpy() for v in model.trainable_variables]
            sgd = tf.keras.optimizers.SGD(1.0)
            if via == "partial":
                opt = hvd.PartialDistributedOptimizer(sgd, local_layers=layers[0],
                                                      scale_local_gradients=scale_local)
            else:
                opt = hvd.DistributedOptimizer(sgd, scale_local_gradients=scale_local)
                for v in layers[0].trainable_weights:
                    opt.register_local_var(as_ref(v) if via == "register_ref" else v)
            opt.apply_gradients([(tf.constant(g[rank], tf.float32), v)
                                 for g, v in zip(gs, model.trainable_variables)])
            for i, v in enumerate(model.trainable_variables):
                step = gs[i][rank] * local_factor if i < 2 else np.mean(gs[i], axis=0)
                np.testing.assert_allclose(v.numpy(), start[i] - step, rtol=1e-6, atol=1e-6,
                                           err_msg="%s scale=%s var %d" % (via, scale_local, i))
    try:
        hvd.PartialDistributedOptimizer(tf.keras.optimizers.SGD(1.0), local_layers=["x"])
    except ValueError as e:
        assert "local_layers" in str(e), e
    else:
        raise AssertionError("a non-layer in local_layers was accepted")


def check_partial_tape(rank, size):
    """PartialDistributedGradientTape and register_local_source take variables or their
    .ref() alike: the local ones keep this rank's gradient / size, the rest the mean."""
    model, layers = model_of(rank)
    x = tf.constant(make_array("tx", rank, (2, 4), tf.float32))
    for how in ("layers", "source", "source_ref"):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        plain = tape.gradient(loss, model.trainable_variables)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        if how == "layers":
            tape = tfhvd.PartialDistributedGradientTape(tape, local_layers=layers[0])
        else:
            tape = tfhvd.DistributedGradientTape(tape)
            for v in layers[0].trainable_weights:
                tape.register_local_source(as_ref(v) if how == "source_ref" else v)
        grads = tape.gradient(loss, model.trainable_variables)
        for i, (g, p) in enumerate(zip(grads, plain)):
            if i < 2:
                expected = p.numpy() / size
            else:
                expected = tfhvd.allreduce(p, op=tfhvd.Average, name="tape.%s.%d" % (how, i)).numpy()
            np.testing.assert_allclose(g.numpy(), expected, rtol=1e-6, atol=1e-6,
                                       err_msg="%s: variable %d" % (how, i))


def local_and_global_case(keras, rank):
    """A three-layer model of `keras` (Keras 3 or tf-keras) with weights and an input
    that differ by rank, and this rank's own gradients (a plain tape)."""
    layers = [keras.layers.Dense(3), keras.layers.Dense(2), keras.layers.Dense(1)]
    model = keras.Sequential([keras.Input((4,))] + layers)
    for i, v in enumerate(model.trainable_variables):
        v.assign(make_array("lw%d" % i, rank, tuple(v.shape), tf.float32) / 4)
    x = tf.constant(make_array("lx", rank, (2, 4), tf.float32))

    def loss():
        return tf.reduce_sum(tf.square(model(x)))

    with tf.GradientTape() as tape:
        value = loss()
    return model, layers, loss, [g.numpy() for g in tape.gradient(value, model.trainable_variables)]


def check_local_and_global_gradients(rank, size):
    """PartialDistributedGradientTape.get_local_and_global_gradients (Horovod 0.28) under
    Keras 3 and tf-keras, with 0, 1 and 2 local layers (local_layers, and
    register_local_source for the second): (source, gradient) pairs in the order of
    the sources, the local ones this rank's own gradient (/ size under
    scale_local_gradients), the others the mean over the ranks, against plain tapes
    of every rank's model in this process. The Keras 3 runs take tf-keras layers too
    (so both are tested at np 2 and 4); the Keras 2 run, tf-keras's alone."""
    import tf_keras
    flavours = [("tf-keras", tf_keras)]
    if not LEGACY:
        import keras
        flavours.insert(0, ("Keras 3", keras))
    for name, module in flavours:
        cases = [local_and_global_case(module, r) for r in range(size)]
        model, layers, loss, _ = cases[rank]
        variables = model.trainable_variables
        mean = [np.mean([case[3][i] for case in cases], axis=0) for i in range(len(variables))]
        for local_layers, registered, scale in (([], [], True), ([layers[1]], [], False),
                                                ([layers[0]], [layers[2]], True)):
            what = "%s, %d local layer(s), scale_local_gradients=%s" % (
                name, len(local_layers) + len(registered), scale)
            with tf.GradientTape() as tape:
                value = loss()
            tape = tfhvd.PartialDistributedGradientTape(tape, local_layers=local_layers,
                                                        scale_local_gradients=scale)
            for layer in registered:
                for v in layer.trainable_weights:
                    tape.register_local_source(v)
            local, reduced = tape.get_local_and_global_gradients(value, variables)
            local_ids = {id(v) for layer in local_layers + registered for v in layer.trainable_weights}
            in_order = [i for i, v in enumerate(variables) if id(v) in local_ids]
            in_order += [i for i, v in enumerate(variables) if id(v) not in local_ids]
            pairs = local + reduced
            assert [id(s) for s, _ in pairs] == [id(variables[i]) for i in in_order], what
            for k, (i, (_, grad)) in enumerate(zip(in_order, pairs)):
                if k < len(local):
                    expected, kind = cases[rank][3][i] / (size if scale else 1), "local"
                else:
                    expected, kind = mean[i], "global"
                np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-5, atol=1e-6,
                                           err_msg="%s: %s gradient of variable %d" % (what, kind, i))
        # Horovod's gradient() keyword: accepted, the same gradients.
        with tf.GradientTape() as tape:
            value = loss()
        grads = tfhvd.DistributedGradientTape(tape).gradient(value, variables, use_generic_names=True)
        for i, g in enumerate(grads):
            np.testing.assert_allclose(g.numpy(), mean[i], rtol=1e-5, atol=1e-6,
                                       err_msg="%s use_generic_names: %d" % (name, i))


def check_legacy_optimizers(rank, size):
    """Keras 2's legacy optimizers, constructed with lr= (their old spelling)."""
    gs = [make_array("lg", r, (4, 1), tf.float32) for r in range(size)]
    for make, what in [(lambda: tf.keras.optimizers.legacy.SGD(lr=0.5), "SGD"),
                       (lambda: tf.keras.optimizers.legacy.SGD(lr=0.5, momentum=0.9),
                        "SGD momentum"),
                       (lambda: tf.keras.optimizers.legacy.Adam(lr=0.5), "Adam")]:
        opt = hvd.DistributedOptimizer(make())
        assert isinstance(opt, tf.keras.optimizers.legacy.Optimizer), type(opt)
        assert abs(float(tf.keras.backend.get_value(opt.lr)) - 0.5) < 1e-7, what
        var = tf.Variable(tf.zeros((4, 1)))
        opt.apply_gradients([(tf.constant(gs[rank], tf.float32), var)])
        # Reference: the same optimizer, in one process, given the mean gradient.
        ref_var = tf.Variable(tf.zeros((4, 1)))
        make().apply_gradients([(tf.constant(np.mean(gs, axis=0), tf.float32), ref_var)])
        np.testing.assert_allclose(var.numpy(), ref_var.numpy(), rtol=1e-6, atol=1e-7,
                                   err_msg="legacy " + what)
    # fit with a legacy optimizer and the LR warmup callback.
    model, _ = model_of(0)
    model.compile(optimizer=hvd.DistributedOptimizer(
        tf.keras.optimizers.legacy.SGD(lr=0.1, momentum=0.5)), loss="mse")
    x = make_array("lx", rank, (4, 4), tf.float32)
    y = make_array("ly", rank, (4, 1), tf.float32)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=1,
                                                                  steps_per_epoch=1)])
    weights = [v.numpy() for v in model.variables]
    every = tfhvd.allgather_object(weights)
    for w in every:
        for a, b in zip(w, weights):
            np.testing.assert_array_equal(a, b, err_msg="ranks diverged under fit")


def check_compute_gradients(rank, size):
    """Horovod's _compute_gradients hook on a tf-keras optimizer: reduced (gradient,
    variable) pairs that apply_gradients applies as they are (op=Sum shows a second
    reduction); with backward_passes_per_step=2, _agg_helper.counter counts the calls
    since the last reduction, and an inf gradient of one cycle does not reach the next."""
    weight = float(rank + 1)
    total = sum(range(1, size + 1))
    var = tf.Variable([0.0, 0.0])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(1.0), op=tfhvd.Sum)
    assert opt._agg_helper is None
    pairs = opt._compute_gradients(lambda: tf.reduce_sum(var * weight), var_list=[var])
    np.testing.assert_allclose(pairs[0][0].numpy(), [total, total], err_msg="reduced gradient")
    assert pairs[0][1] is var
    opt.apply_gradients(pairs)
    np.testing.assert_allclose(var.numpy(), [-total, -total], err_msg="applied once")
    with tf.GradientTape() as tape:  # the tape form
        loss = tf.reduce_sum(var * weight)
    pairs = opt._compute_gradients(loss, var_list=[var], tape=tape)
    np.testing.assert_allclose(pairs[0][0].numpy(), [total, total], err_msg="tape form")
    opt.apply_gradients(pairs)
    np.testing.assert_allclose(var.numpy(), [-2 * total, -2 * total], err_msg="applied once, tape")

    # Aggregation over 2 calls; the first cycle's gradient is inf.
    x = tf.Variable(0.0)
    calls = tf.Variable(0)
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(1.0),
                                   backward_passes_per_step=2, sparse_as_dense=True)

    def loss():
        calls.assign_add(1)
        return tf.cond(calls > 2, lambda: x, lambda: x * float("inf"))

    for step in range(3):
        pairs = opt._compute_gradients(loss, var_list=[x])
        opt.apply_gradients(pairs)
        assert int(opt._agg_helper.counter.numpy()) == (step + 1) % 2, step
    assert np.isfinite(pairs[0][0].numpy()), pairs  # the third call's: a new cycle
    assert int(opt.iterations.numpy()) == 3


# What Horovod's horovod.tensorflow.keras takes from horovod.tensorflow (a Keras script
# calls them as hvd.<name>): the timeline and the *_built queries were once missing here.
HOROVOD_KERAS_BASICS = [
    "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size",
    "cross_size", "rank", "local_rank", "cross_rank", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "Average", "Sum", "Compression"]


def expect_value_error(what, fn, contains):
    try:
        fn()
    except ValueError as e:
        assert contains in str(e), "%s: %s" % (what, e)
        return
    raise AssertionError("%s: no ValueError" % what)


def check_horovod_rules(rank, size):
    # The TF module's DistributedOptimizer of a Keras optimizer is the Keras one's.
    sgd = tf.keras.optimizers.SGD(learning_rate=0.5)
    opt = tfhvd.DistributedOptimizer(sgd)
    assert "_perseus_reduce_args" in vars(type(opt)), type(opt)
    gs = [make_array("hr", r, (4, 1), tf.float32) for r in range(size)]
    var = tf.Variable(tf.zeros((4, 1)))
    opt.apply_gradients([(tf.constant(gs[rank], tf.float32), var)])
    np.testing.assert_allclose(var.numpy(), -0.5 * np.mean(gs, axis=0), rtol=1e-6,
                               err_msg="TF module's DistributedOptimizer of a Keras SGD")
    expect_value_error("Keras optimizer, Adasum", lambda: tfhvd.DistributedOptimizer(
        sgd, op=tfhvd.Adasum), "Adasum is not supported yet with Keras")
    expect_value_error("Keras optimizer, Sum", lambda: tfhvd.DistributedOptimizer(
        sgd, op=tfhvd.Sum), "perseus.tensorflow.keras.DistributedOptimizer")
    expect_value_error("neither kind", lambda: tfhvd.DistributedOptimizer(object()),
                       "doesn't inherit from either")
    # The Keras optimizer: ops, groups.
    expect_value_error("Keras op=Max", lambda: hvd.DistributedOptimizer(sgd, op=hvd.Max),
                       "only supports Average and Sum")
    for bad in (0, -2):
        expect_value_error("groups=%d" % bad, lambda: hvd.DistributedOptimizer(sgd, groups=bad),
                           "groups should be")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=0.5), num_groups=2)
    assert any(w.category is DeprecationWarning and "num_groups" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    for groups in (2, 3):  # a count: the gradients in that many groups, the same result
        variables = [tf.Variable(tf.zeros((4, 1))) for _ in range(3)]
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=0.5), groups=groups,
                                       op=hvd.Sum)
        opt.apply_gradients([(tf.constant(gs[rank] * (k + 1), tf.float32), v)
                             for k, v in enumerate(variables)])
        for k, v in enumerate(variables):
            np.testing.assert_allclose(v.numpy(), -0.5 * (k + 1) * np.sum(gs, axis=0), rtol=1e-6,
                                       err_msg="groups=%d, variable %d" % (groups, k))

    # LearningRateScheduleCallback: a number multiplier decays exponentially from
    # start_epoch; both lr callbacks log the lr; initial_lr is required.
    expect_value_error("initial_lr=None", lambda: hvd.callbacks.LearningRateScheduleCallback(
        None, 0.5), "`initial_lr` is required")
    model, _ = model_of(0)
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=0.1)),
                  loss="mse")
    x = make_array("sx", rank, (4, 4), tf.float32)
    y = make_array("sy", rank, (4, 1), tf.float32)
    history = model.fit(x, y, batch_size=4, epochs=5, verbose=0, callbacks=[
        hvd.callbacks.LearningRateScheduleCallback(0.1, 0.5, start_epoch=1, end_epoch=4)])
    expected = [0.1, 0.1, 0.05, 0.025, 0.025]  # epoch 0: before start; 4: after end
    np.testing.assert_allclose(history.history["lr"], expected, rtol=1e-6,
                               err_msg="lr per epoch (%s)" % history.history)
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(0.2, warmup_epochs=1, steps_per_epoch=1)])
    np.testing.assert_allclose(history.history["lr"], [0.2], rtol=1e-6)

    # The Keras module's collectives: Horovod's Keras argument order.
    xs = [make_array("kc", r, (3,), tf.float32) for r in range(size)]
    np.testing.assert_allclose(hvd.allreduce(xs[rank], "kc.sum", False).numpy(),
                               np.sum(xs, axis=0), rtol=1e-6, err_msg="allreduce(v, name, False)")
    np.testing.assert_allclose(hvd.allreduce(xs[rank], "kc.mean").numpy(),
                               np.mean(xs, axis=0), rtol=1e-6, err_msg="allreduce(v, name)")
    rows = np.concatenate([xs[r][None] for r in range(size)] * size)
    mine = hvd.reducescatter(rows * (rank + 1), "kc.rs", hvd.Sum).numpy()
    np.testing.assert_allclose(mine, rows[rank * size:(rank + 1) * size] * sum(
        range(1, size + 1)), rtol=1e-6, err_msg="reducescatter(v, name, op)")
    np.testing.assert_allclose(hvd.broadcast(xs[rank], size - 1, "kc.b").numpy(), xs[size - 1])
    np.testing.assert_allclose(hvd.allgather(xs[rank][None], "kc.g").numpy(), np.stack(xs))


def check_horovod_keras_names():
    missing = [n for n in HOROVOD_KERAS_BASICS if getattr(hvd, n, None) is not getattr(tfhvd, n)]
    assert not missing, "perseus.tensorflow.keras lacks Horovod's %s" % missing
    assert hvd.mpi_built() and not hvd.gloo_enabled() and hvd.is_homogeneous()


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_horovod_keras_names()
    check_broadcast_callback(rank, size)
    check_broadcast_callback(rank, size, refs=True)  # local_variables given as .ref()
    log("broadcast callback ok")
    check_partial_tape(rank, size)
    log("partial tape ok")
    check_local_and_global_gradients(rank, size)
    log("local and global gradients ok")
    check_partial_optimizer(rank, size)
    log("partial optimizer ok")
    check_horovod_rules(rank, size)
    log("Horovod's optimizer, callback and collective rules ok")
    if LEGACY:
        check_legacy_optimizers(rank, size)
        log("legacy optimizers ok")
        check_compute_gradients(rank, size)
        log("_compute_gradients ok")
    hvd.shutdown()


main(body)
