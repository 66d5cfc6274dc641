"""hvd.elastic for TensorFlow and Keras on the fixed MPI world: state sync from
rank 0, commit / restore, run() retrying after an injected HorovodInternalError
and after a real collective failure (a TF error from a Perseus op), reset
callbacks, the Keras state callbacks in model.fit, the resize error, and what run()
refuses or persists in a job that perseusrun --elastic restarts (no ULFM).

References: every rank's initial weights come from make_array(tag, rank), so each
rank rebuilds rank 0's; a step applies the averaged gradient (r + 1) x (epoch + 1)
of every rank with plain SGD, which each rank computes itself with numpy.
"""
import numpy as np

from common import hvd, log, main, make_array as _make_array, tf

import perseus.tensorflow.keras as hvd_keras

LR = 0.5


def make_array(tag, rank, shape):
    """Small integers as float64 (exact in float32 too)."""
    return _make_array(tag, rank, shape, tf.float64)


def build(rank):
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    model.set_weights([make_array("w%d" % i, rank, w.shape).astype(np.float32)
                       for i, w in enumerate(model.get_weights())])
    return model


def weights(model):
    return [np.array(w) for w in model.get_weights()]


def assert_same(actual, expected, what):
    assert len(actual) == len(expected), what
    for a, e in zip(actual, expected):
        if not np.array_equal(np.asarray(a), np.asarray(e)):
            raise AssertionError("%s: got %r, expected %r" % (what, a, e))


def step(model, optimizer, epoch, rank):
    grads = [hvd.allreduce(tf.fill(v.shape, float((rank + 1) * (epoch + 1))))
             for v in model.trainable_variables]
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


def reference(epochs, size):
    ws = weights(build(0))
    for epoch in range(epochs):
        g = sum((r + 1) * (epoch + 1) for r in range(size)) / size
        ws = [w - np.float32(LR * g) for w in ws]
    return ws


def check_keras_state(rank, size):
    model = build(rank)
    opt = tf.keras.optimizers.SGD(LR, momentum=0.5)
    state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=10 * rank, note=[rank])
    state.sync()
    assert_same(weights(model), weights(build(0)), "sync: rank 0's weights")
    assert (state.epoch, state.note) == (0, [0]), (state.epoch, state.note)
    # The synced values are the committed ones: restore() returns to rank 0's.
    for v in model.variables:
        v.assign_add(tf.fill(v.shape, float(rank + 1)))
    state.restore()
    assert_same(weights(model), weights(build(0)), "restore after sync: rank 0's weights")

    step(model, opt, 0, rank)
    state.epoch = 1
    state.commit()
    committed = weights(model)
    committed_opt = [v.numpy() for v in opt.variables]
    step(model, opt, 1, rank)
    for v in model.variables:
        v.assign_add(tf.fill(v.shape, float(rank + 1)))
    state.epoch = 99
    state.restore()
    assert_same(weights(model), committed, "restore: committed weights")
    assert_same([v.numpy() for v in opt.variables], committed_opt, "restore: optimizer")
    assert state.epoch == 1

    # TensorFlowState over plain variables, and a plain ObjectState.
    v = tf.Variable(make_array("v", rank, (4,)))
    tstate = hvd.elastic.TensorFlowState([v], step_no=rank)
    tstate.sync()
    assert_same([v.numpy()], [make_array("v", 0, (4,))], "TensorFlowState sync")
    assert tstate.step_no == 0
    v.assign(tf.fill([4], tf.constant(rank + 2, tf.float64)))
    tstate.restore()  # to rank 0's synced values, not this rank's from before the sync
    assert_same([v.numpy()], [make_array("v", 0, (4,))], "TensorFlowState restore after sync")
    v.assign_add(tf.ones(4, tf.float64))
    tstate.commit()
    v.assign(tf.zeros(4, tf.float64))
    tstate.restore()
    assert_same([v.numpy()], [make_array("v", 0, (4,)) + 1], "TensorFlowState restore")
    obj = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, x=rank)
    obj.sync()
    assert obj.x == 0


def check_run_retries(rank, size):
    def injected():
        raise hvd.HorovodInternalError("injected failure")

    def mismatch():
        # Shapes differ across ranks: a TF error from the Perseus op on every rank,
        # which run() treats as Horovod treats its ops' failures.
        hvd.allreduce(tf.ones(rank + 1), name="elastic_mismatch")

    for fail in (injected, mismatch):
        model = build(rank)
        opt = tf.keras.optimizers.SGD(LR)
        state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=0)
        attempts, resets = [], []
        state.register_reset_callbacks([lambda: resets.append(state.epoch)])

        @hvd.elastic.run
        def train(state, epochs):
            attempts.append(state.epoch)
            for epoch in range(state.epoch, epochs):
                step(state.model, state.optimizer, epoch, rank)
                state.epoch = epoch + 1
                state.commit()
                if epoch == 1 and len(attempts) == 1:
                    step(state.model, state.optimizer, 7, rank)  # lost with the failure
                    state.epoch = 42
                    fail()
            return state.epoch

        assert train(state, 4) == 4
        assert attempts == [0, 2] and resets == [2], (fail.__name__, attempts, resets)
        assert_same(weights(model), reference(4, size), fail.__name__ + ": trained weights")
        log("run retried after", fail.__name__)

    # A script error is not retried.
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, n=0)
    calls = []

    @hvd.elastic.run
    def bad(state):
        calls.append(1)
        hvd.alltoall(tf.ones(size + 1))  # uneven equal split: the caller's mistake

    try:
        bad(state)
    except Exception as e:
        assert not isinstance(e, hvd.HorovodInternalError) and calls == [1], (type(e), calls)
    else:
        raise AssertionError("an invalid alltoall did not fail")


class FailOnce(tf.keras.callbacks.Callback):
    def __init__(self, state, attempts):
        super().__init__()
        self.state, self.attempts = state, attempts

    def on_epoch_end(self, epoch, logs=None):
        if len(self.attempts) == 1 and self.state.epoch == 2:
            raise hvd.HorovodInternalError("injected in fit")


def check_keras_fit(rank, size):
    model = build(rank)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    x = make_array("x", 0, (16, 3)).astype(np.float32)  # the same data on every rank
    y = make_array("y", 0, (16, 2)).astype(np.float32)
    state = hvd_keras.elastic.KerasState(model, epoch=0, batch=0)
    attempts, resets = [], []
    state.register_reset_callbacks([lambda: resets.append(state.epoch)])

    @hvd_keras.elastic.run
    def train(state, epochs):
        attempts.append(state.epoch)
        callbacks = [hvd_keras.elastic.UpdateEpochStateCallback(state),
                     hvd_keras.elastic.UpdateBatchStateCallback(state),
                     hvd_keras.elastic.CommitStateCallback(state, batches_per_commit=2),
                     FailOnce(state, attempts)]
        state.model.fit(x, y, batch_size=4, epochs=epochs - state.epoch, callbacks=callbacks,
                        shuffle=False, verbose=0)
        return state.epoch

    assert train(state, 4) == 4
    assert attempts == [0, 2] and resets == [2], (attempts, resets)
    # Same data and rank 0's start everywhere: every rank ends with the same weights.
    gathered = hvd.allgather_object(weights(model))
    for other in gathered:
        assert_same(other, gathered[0], "weights after fit")


def check_resize_refused(rank, size):
    from perseus.common.exceptions import HostsUpdatedInterrupt

    @hvd.elastic.run
    def train(state):
        raise HostsUpdatedInterrupt(False)

    try:
        train(hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=0))
    except NotImplementedError as e:
        assert "--min-np" in str(e) and "fixed world" in str(e), e
    else:
        raise AssertionError("a resize request was not refused")


def check_restart_persistence(rank, size):
    """In a job that perseusrun --elastic restarts (no ULFM: its variables set by hand
    here), run() refuses a TensorFlow state on every rank, which could not resume its
    variables from a persisted commit, and persists an ObjectState's commits (rank 0
    writes the file, of the last commit)."""
    import os
    import pickle
    from perseus.common import elastic

    folder = os.path.join(os.environ["PTEST_TMPDIR"], "commits")
    os.environ.update(PERSEUS_ELASTIC_RUN_ID="tf-check", PERSEUS_ELASTIC_RESTARTS="0",
                      PERSEUS_ELASTIC_RESET_LIMIT="1", PERSEUS_ELASTIC_PERSIST_DIR=folder)
    try:
        @hvd.elastic.run
        def train(state):
            for state.epoch in range(state.epoch, 3):
                state.commit()

        try:
            train(hvd.elastic.TensorFlowKerasState(build(rank), epoch=0))
        except elastic.PersistError as e:
            assert "TensorFlowKerasState cannot persist its commits yet" in str(e), e
        else:
            raise AssertionError("run() accepted a TensorFlow state it cannot persist")
        train(hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=0))
        hvd.allreduce(tf.constant(0.0), name="persisted")  # rank 0 has written by now
        if rank == 0:
            with open(elastic.persist_path(folder, "tf-check"), "rb") as f:
                record = pickle.load(f)
            assert (record["commit"], record["state"]) == (3, {"epoch": 2}), record
    finally:
        for name in ("PERSEUS_ELASTIC_RUN_ID", "PERSEUS_ELASTIC_RESTARTS",
                     "PERSEUS_ELASTIC_RESET_LIMIT", "PERSEUS_ELASTIC_PERSIST_DIR"):
            os.environ.pop(name)


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    for check in (check_keras_state, check_run_retries, check_keras_fit, check_resize_refused,
                  check_restart_persistence):
        check(rank, size)
        log(check.__name__, "passed")
    hvd.shutdown()


main(body)
