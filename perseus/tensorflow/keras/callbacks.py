"""Horovod's Keras callbacks: start every rank from root's weights, average
metrics over the ranks, warm up and schedule the learning rate."""

import numpy as np
import tensorflow as tf

from perseus.common import basics
from perseus.tensorflow import mpi_ops
from perseus.tensorflow.functions import broadcast_variables, variable_key


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """At the start of training, sets every rank's model and optimizer variables to
    root_rank's (the optimizer's exist by then: fit builds it before on_train_begin),
    except `local_variables` (a variable or a list: each rank keeps its own)."""

    def __init__(self, root_rank, device='', local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self._local_ids = {variable_key(v) for v in local_variables}  # variables or their .ref()
        self.broadcast_done = False

    def _broadcast(self):
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            variables += list(optimizer.variables() if callable(optimizer.variables)
                              else optimizer.variables)
        broadcast_variables([v for v in variables if variable_key(v) not in self._local_ids],
                            self.root_rank)
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(tf.keras.callbacks.Callback):
    """At each epoch's end, replaces the numeric logs with their average over the
    ranks (one allreduce in float64, keys in sorted order so every rank agrees), as
    numpy scalars as Horovod's are (.item() works; np.float64 is a float too)."""

    def __init__(self, device=''):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or basics.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0
                      and np.issubdtype(np.asarray(v).dtype, np.number))
        if not keys:
            return
        values = tf.constant([float(logs[k]) for k in keys], dtype=tf.float64)
        averaged = mpi_ops.allreduce(values, op=mpi_ops.Average,
                                     name="metric_average.%d" % epoch).numpy()
        for key, value in zip(keys, averaged):
            logs[key] = value


def _get_lr(optimizer):
    lr = optimizer.learning_rate
    return float(lr.numpy()) if hasattr(lr, "numpy") else float(lr)


def _set_lr(optimizer, value):
    lr = optimizer.learning_rate
    if hasattr(lr, "assign"):
        lr.assign(value)
    else:
        optimizer.learning_rate = value


def _momentum(optimizer):
    momentum = getattr(optimizer, "momentum", 0.0)
    return float(momentum.numpy()) if hasattr(momentum, "numpy") else float(momentum or 0.0)


def _velocities(optimizer):
    """The optimizer's momentum buffers: `momentums` (SGD) or `_momentums` (RMSprop) in
    Keras 3 and tf-keras, the "momentum" slots of tf-keras' legacy optimizers."""
    for attr in ("momentums", "_momentums"):
        buffers = getattr(optimizer, attr, None)
        if buffers:
            return list(buffers)
    slots = getattr(optimizer, "_slots", None)
    if isinstance(slots, dict):
        return [s["momentum"] for s in slots.values() if "momentum" in s]
    return []


def _correct_momentum(optimizer, ratio):
    """Momentum correction (Goyal et al.) for the step after the lr changed by `ratio`.

    Horovod multiplies the momentum coefficient by ratio for that one step. Keras 3
    and tf-keras keep SGD's momentum as a Python float that the traced train function
    has already read, so changing it would do nothing. The same step is had by scaling
    the velocity instead: their velocity includes the lr (v = mu * v - lr * g, then
    w += v), so (ratio * mu) * v == mu * (ratio * v), and nothing needs restoring."""
    buffers = _velocities(optimizer)
    if not buffers:
        if int(optimizer.iterations.numpy()) == 0:
            return  # no step taken yet: the velocity is zero either way
        raise NotImplementedError(
            "momentum correction: cannot find the momentum buffers of %s; pass "
            "momentum_correction=False" % type(optimizer).__name__)
    for v in buffers:
        v.assign(v * ratio)


class LearningRateScheduleCallback(tf.keras.callbacks.Callback):
    """lr = initial_lr * multiplier(epoch) for start_epoch <= epoch < end_epoch.

    multiplier: a function of the (fractional, unless staircase) epoch, or a number m,
    as Horovod: exponential decay, lr = initial_lr * m ** (epoch - start_epoch).
    Each epoch's end logs the lr as logs["lr"] (History), as Horovod's.
    steps_per_epoch: needed for staircase=False when fit cannot tell (params).
    momentum_correction: when the lr changes from old to new, the next step uses
    momentum * new / old (Goyal et al., "Accurate, Large Minibatch SGD")."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")  # Horovod's text
        self.initial_lr = initial_lr
        self.multiplier = (multiplier if callable(multiplier)
                           else lambda epoch: multiplier ** (epoch - start_epoch))
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.momentum_correction = momentum_correction
        self.current_epoch = 0

    def on_train_begin(self, logs=None):
        # Nesterov's step also uses the momentum coefficient outside the velocity
        # (w += mu * v - lr * g), so scaling the velocity (see _correct_momentum) is
        # not the scaled-momentum step there, and the coefficient itself cannot change.
        optimizer = self.model.optimizer
        if self.momentum_correction and _momentum(optimizer) and getattr(optimizer, "nesterov",
                                                                         False):
            raise NotImplementedError(
                "%s(momentum_correction=True) with Nesterov momentum is not supported by "
                "Perseus (Keras reads the momentum coefficient once, when it traces the "
                "train step); pass momentum_correction=False" % type(self).__name__)

    def _adjust_lr(self, new_lr):
        optimizer = self.model.optimizer
        old_lr = _get_lr(optimizer)
        _set_lr(optimizer, new_lr)
        new_lr = _get_lr(optimizer)  # as stored (float32 in Keras 3)
        if self.momentum_correction and _momentum(optimizer) and old_lr and new_lr != old_lr:
            _correct_momentum(optimizer, new_lr / old_lr)

    def _active(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _steps(self):
        return self.steps_per_epoch or (self.params or {}).get("steps")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self._active(epoch) and self.staircase:
            self._adjust_lr(self.initial_lr * self.multiplier(epoch))

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase or not self._active(self.current_epoch):
            return
        steps = self._steps()
        if not steps:
            raise ValueError("staircase=False needs steps_per_epoch")
        epoch = self.current_epoch + float(batch) / steps
        self._adjust_lr(self.initial_lr * self.multiplier(epoch))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the lr from initial_lr / size() to initial_lr over warmup_epochs, per
    batch (Goyal et al., "Accurate, Large Minibatch SGD"): large global batches
    start gently."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        size = basics.size()

        def multiplier(epoch):
            # One batch ahead, as in Horovod: the last warmup batch runs at initial_lr.
            epoch += 1.0 / self._steps()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g."
                  % (epoch + 1, self.initial_lr))
