"""TF1-style training: DistributedOptimizer over a tf.compat.v1.train.Optimizer and
BroadcastGlobalVariablesHook for tf.compat.v1.train.MonitoredTrainingSession."""

import tensorflow as tf

from perseus.tensorflow import mpi_ops
from perseus.tensorflow.compression import Compression
from perseus.tensorflow.functions import broadcast_global_variables
from perseus.tensorflow.gradient_accumulation import (GradientAccumulator, check_passes,
                                                      run_every_k)
from perseus.tensorflow.gradients import reduce_gradients


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """Delegates to the wrapped optimizer; compute_gradients() returns gradients
    averaged over the ranks.

    With backward_passes_per_step=k, compute_gradients() adds the local gradients to
    sums and returns the reduced sums on every k-th run (the local gradients, unused,
    on the others); apply_gradients() updates the variables only on those runs and
    otherwise just increments global_step (as Horovod does)."""

    def __init__(self, optimizer, name, use_locking, reduce_args, passes, average):
        super().__init__(name=name or "Distributed" + type(optimizer).__name__,
                         use_locking=use_locking)
        self._optimizer = optimizer
        self._reduce_args = reduce_args
        self._accumulator = None if passes == 1 else GradientAccumulator(
            passes, average, lambda grads, variables: reduce_gradients(grads, variables,
                                                                       **reduce_args))

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._accumulator is None:
            grads = reduce_gradients(grads, variables, **self._reduce_args)
            return list(zip(grads, variables))
        due = self._accumulator.add(grads, variables)
        present = [i for i, g in enumerate(grads) if g is not None]
        local = [tf.convert_to_tensor(grads[i]) for i in present]
        chosen = tf.cond(due, lambda: [g for g in self._accumulator.take(variables)
                                       if g is not None],
                         lambda: [tf.identity(g) for g in local])
        chosen = list(chosen) if isinstance(chosen, (list, tuple)) else [chosen]
        grads = [None] * len(grads)
        for i, g in zip(present, chosen):
            grads[i] = g
        return list(zip(grads, variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if self._accumulator is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        pairs = list(grads_and_vars)
        applied = self._accumulator.was_reset([g for g, _ in pairs if g is not None])

        def count_step():
            if global_step is None:
                return None
            return global_step.assign_add(tf.constant(1, global_step.dtype.base_dtype),
                                          read_value=False)
        done = run_every_k(applied, lambda: self._optimizer.apply_gradients(pairs, global_step,
                                                                             name),
                           count_step)
        return done if tf.executing_eagerly() else done.op

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense='',
                         device_sparse='', compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=mpi_ops.Average,
                         gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=mpi_ops.global_process_set):
    """Wraps a tf.compat.v1.train.Optimizer (TF1 graphs) so that its gradients are
    averaged over the ranks. Keras optimizers: use perseus.tensorflow.keras."""
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError("perseus.tensorflow.horovod.DistributedOptimizer wraps a "
                         "tf.compat.v1.train.Optimizer; for a Keras optimizer use "
                         "perseus.tensorflow.keras.DistributedOptimizer (got %s)"
                         % type(optimizer).__name__)
    return _DistributedOptimizer(optimizer, name, use_locking, dict(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
        groups=groups, process_set=process_set), check_passes(backward_passes_per_step),
        bool(average_aggregated_gradients))


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Broadcasts root_rank's global variables to every rank once the session is
    created (after initialization or checkpoint restore on the root)."""

    def __init__(self, root_rank, device=''):
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)
