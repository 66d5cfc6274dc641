"""backward_passes_per_step and momentum correction against single-process references
(float64):
  * Keras model.fit with DistributedOptimizer(backward_passes_per_step=2), with and
    without average_aggregated_gradients, ranks starting from different weights:
    equals one process that sums the whole-batch gradients of 2 consecutive batches
    before each update (the count runs on across epochs; a trailing odd batch only
    accumulates); optimizer.iterations counts every batch, as in Horovod;
  * the same for a TF1 graph (GradientDescent, and Momentum with averaging) under
    MonitoredTrainingSession; global_step counts every run;
  * LearningRateWarmupCallback / LearningRateScheduleCallback with
    momentum_correction=True over SGD(momentum): equals hand-computed SGD with
    momentum whose coefficient is multiplied by new_lr / old_lr on the step after
    each lr change.
Rank r's batch b is rows [3r, 3r + 3) of global batch b (3 * size rows); the
references run on the global batches with plain TensorFlow gradients and numpy."""
import numpy as np
import tensorflow as tf

from common import hvd, log, main
from tiny_model import forward, init_weights, keras_model, mse_gradient

import perseus.tensorflow.keras as hvd_keras

LR = 0.125
ROWS = 3  # per rank and batch


def global_batches(size, count):
    rng = np.random.default_rng(5)
    return [(rng.normal(size=(ROWS * size, 5)), rng.normal(size=(ROWS * size, 2)))
            for _ in range(count)]


def local_data(batches, rank):
    part = slice(ROWS * rank, ROWS * rank + ROWS)
    return (np.concatenate([x[part] for x, _ in batches]),
            np.concatenate([y[part] for _, y in batches]))


def accumulated_reference(batches, passes, average, momentum=0.0):
    """Sums the gradients of `passes` consecutive batches, then one update: plain
    SGD (w -= lr * g), or TF1's Momentum (a = momentum * a + g; w -= lr * a)."""
    ws = init_weights(0)
    velocity = [np.zeros_like(w) for w in ws]
    sums = [np.zeros_like(w) for w in ws]
    for i, (x, y) in enumerate(batches):
        sums = [s + g for s, g in zip(sums, mse_gradient(ws, x, y))]
        if (i + 1) % passes == 0:
            grads = [s / passes if average else s for s in sums]
            velocity = [momentum * v + g for v, g in zip(velocity, grads)]
            ws = [w - LR * v for w, v in zip(ws, velocity)]
            sums = [np.zeros_like(w) for w in ws]
    return ws


def keras_weights(model):
    return [model.layers[0].kernel.numpy(), model.layers[0].bias.numpy(),
            model.layers[1].kernel.numpy()]


def assert_weights(got, expected, what):
    for i, (g, e) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12, err_msg="%s [%d]" % (what, i))
    everyone = hvd.allgather_object([g.tobytes() for g in got])
    assert all(e == everyone[0] for e in everyone), what + ": ranks differ"


def check_keras_passes(rank, size):
    tf.keras.backend.set_floatx("float64")
    batches = global_batches(size, 3)
    x, y = local_data(batches, rank)
    for average in (False, True):
        model = keras_model(seed=rank)  # only rank 0 starts from the reference
        model.compile(loss="mse", optimizer=hvd_keras.DistributedOptimizer(
            tf.keras.optimizers.SGD(learning_rate=LR), backward_passes_per_step=2,
            average_aggregated_gradients=average))
        callbacks = [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)]
        # 3 batches per epoch: the second update takes one batch from each epoch.
        model.fit(x, y, batch_size=ROWS, epochs=2, shuffle=False, verbose=0,
                  callbacks=callbacks)
        what = "Keras fit, average_aggregated_gradients=%s" % average
        expected = accumulated_reference(batches * 2, 2, average)
        assert_weights(keras_weights(model), expected, what)
        assert int(model.optimizer.iterations.numpy()) == 6, what
        # One more batch is only accumulated: no update.
        model.fit(x[:ROWS], y[:ROWS], batch_size=ROWS, epochs=1, shuffle=False, verbose=0)
        assert_weights(keras_weights(model), expected, what + ", after an odd batch")
        assert int(model.optimizer.iterations.numpy()) == 7, what
    log("keras backward_passes_per_step ok")


def check_tf1_passes(rank, size):
    batches = global_batches(size, 5)
    part = slice(ROWS * rank, ROWS * rank + ROWS)
    v1 = tf.compat.v1
    for optimizer, momentum, average in [(lambda: v1.train.GradientDescentOptimizer(LR), 0.0,
                                          False),
                                         (lambda: v1.train.MomentumOptimizer(LR, 0.5), 0.5,
                                          True)]:
        graph = tf.Graph()
        with graph.as_default():
            ws = [v1.get_variable("w%d" % i, initializer=w, dtype=tf.float64)
                  for i, w in enumerate(init_weights(seed=rank))]
            xs = v1.placeholder(tf.float64, (ROWS, 5))
            ys = v1.placeholder(tf.float64, (ROWS, 2))
            loss = tf.reduce_mean((forward(ws, xs) - ys) ** 2)
            global_step = v1.train.get_or_create_global_step()
            opt = hvd.DistributedOptimizer(optimizer(), backward_passes_per_step=2,
                                           average_aggregated_gradients=average)
            train_op = opt.minimize(loss, global_step=global_step)
            hooks = [hvd.BroadcastGlobalVariablesHook(0)]
            with v1.train.MonitoredTrainingSession(checkpoint_dir=None, hooks=hooks) as sess:
                for x, y in batches:  # 5 runs: 2 updates, the last batch only accumulated
                    sess.run(train_op, feed_dict={xs: x[part], ys: y[part]})
                got, step = sess.run([ws, global_step])
        what = "TF1 %s" % type(opt._optimizer).__name__
        assert_weights(got, accumulated_reference(batches, 2, average, momentum), what)
        assert step == len(batches), (what, step)
    log("tf1 backward_passes_per_step ok")


def momentum_reference(batches, lrs, momentum):
    """SGD with momentum as Keras writes it (v = mu * v - lr * g; w += v), with mu
    multiplied by lrs[i] / lrs[i - 1] on step i when the lr changed."""
    ws = init_weights(0)
    velocity = [np.zeros_like(w) for w in ws]
    for i, (x, y) in enumerate(batches):
        mu = momentum * (lrs[i] / lrs[i - 1] if i > 0 else 1.0)
        grads = mse_gradient(ws, x, y)
        velocity = [mu * v - lrs[i] * g for v, g in zip(velocity, grads)]
        ws = [w + v for w, v in zip(ws, velocity)]
    return ws


def check_momentum_correction(rank, size):
    tf.keras.backend.set_floatx("float64")
    steps = 4
    # Warmup over the first epoch (lr changes on every batch, one batch ahead, so the
    # last warmup batch runs at the full lr), then constant; and a staircase schedule
    # that halves the lr each epoch. All lrs are exact in float32.
    warmup = [0.5 / size * ((b + 1) / steps * (size - 1) + 1) for b in range(steps)]
    assert warmup[-1] == 0.5
    cases = [("warmup", 2, warmup + [warmup[-1]] * steps,
              lambda: hvd_keras.callbacks.LearningRateWarmupCallback(
                  0.5, warmup_epochs=1, steps_per_epoch=steps)),
             ("staircase", 3, [0.5 * 0.5 ** (i // steps) for i in range(3 * steps)],
              lambda: hvd_keras.callbacks.LearningRateScheduleCallback(
                  0.5, lambda epoch: 0.5 ** epoch, staircase=True))]
    for what, epochs, lrs, callback in cases:
        batches = global_batches(size, steps)
        x, y = local_data(batches, rank)
        model = keras_model(seed=0)
        model.compile(loss="mse", optimizer=hvd_keras.DistributedOptimizer(
            tf.keras.optimizers.SGD(learning_rate=0.5, momentum=0.75)))
        model.fit(x, y, batch_size=ROWS, epochs=epochs, shuffle=False, verbose=0,
                  callbacks=[callback()])
        assert_weights(keras_weights(model), momentum_reference(batches * epochs, lrs, 0.75),
                       "momentum correction, " + what)
        # The coefficient itself is left as it was.
        assert float(model.optimizer.momentum) == 0.75, model.optimizer.momentum
    log("momentum correction ok")


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_keras_passes(rank, size)
    check_tf1_passes(rank, size)
    check_momentum_correction(rank, size)
    hvd.shutdown()


main(body)
