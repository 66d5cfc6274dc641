"""TF1-style training: DistributedOptimizer over a tf.compat.v1.train.Optimizer and
BroadcastGlobalVariablesHook for tf.compat.v1.train.MonitoredTrainingSession.

With op=Adasum the optimizer is Horovod's delta optimizer (as perseus.torch's):
Adasum combines the updates the ranks' optimizers would make, not their gradients,
so momentum, Adam's scaling etc. act before the combination. compute_gradients()
then returns the local gradients, and apply_gradients() does, for each variable v,

    start = v;  the wrapped optimizer updates v locally;  delta = v - start
    v = start + Adasum of delta over the process set

Optimizer slots stay per rank, as in Horovod.
"""

import tensorflow as tf

from perseus.common import ops as _ops
from perseus.tensorflow import mpi_ops
from perseus.tensorflow.compression import Compression
from perseus.tensorflow.functions import broadcast_global_variables, variable_key
from perseus.tensorflow.gradient_accumulation import (GradientAccumulator, _as_op,
                                                      _local_variable, check_passes,
                                                      run_every_k)
from perseus.tensorflow.gradients import reduce_gradients, resolve_groups, scale_factors


def _after_deps(grad):
    """An identity of grad (dense or tf.IndexedSlices), made under the caller's
    control dependencies."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(tf.identity(grad.values), tf.identity(grad.indices),
                                grad.dense_shape)
    return tf.identity(grad)


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """Delegates to the wrapped optimizer; compute_gradients() returns gradients
    averaged over the ranks.

    With backward_passes_per_step=k, compute_gradients() adds the local gradients to
    sums and returns the reduced sums on every k-th run (the local gradients, unused,
    on the others); apply_gradients() updates the variables only on those runs and
    otherwise just increments global_step (as Horovod does).

    With op=Adasum the gradients (or their sums over k runs) stay local and
    apply_gradients() reduces the variables' updates instead (the module's doc)."""

    def __init__(self, optimizer, name, use_locking, reduce_args, passes, average):
        super().__init__(name=name or "Distributed" + type(optimizer).__name__,
                         use_locking=use_locking)
        self._optimizer = optimizer
        self._reduce_args = reduce_args
        self._local_vars = set()  # variable_key()s: register_local_var
        self._adasum = mpi_ops._resolve_op(reduce_args["op"], None) == mpi_ops.Adasum
        if self._adasum:
            self._reduce = lambda grads, variables: list(grads)
        else:
            self._reduce = lambda grads, variables: reduce_gradients(
                grads, variables, skip=[i for i, v in enumerate(variables)
                                        if variable_key(v) in self._local_vars],
                **reduce_args)
        self._starts = {}  # Adasum: variable.ref() -> its value before the local update
        self._accumulator = None if passes == 1 else GradientAccumulator(passes, average,
                                                                         self._reduce)

    def register_local_var(self, var):
        """Leaves `var`'s gradient local to this rank (divided by the set's size under
        scale_local_gradients), as Horovod's register_local_var."""
        if self._adasum:
            raise NotImplementedError("register_local_var with op=Adasum is not supported "
                                      "(Adasum combines every variable's update)")
        self._local_vars.add(variable_key(var))

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._accumulator is None:
            return list(zip(self._reduce(grads, variables), variables))
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
        update = self._apply_adasum if self._adasum else self._optimizer.apply_gradients
        if self._accumulator is None:
            return update(grads_and_vars, global_step, name)
        pairs = list(grads_and_vars)
        applied = self._accumulator.was_reset([g for g, _ in pairs if g is not None])

        def count_step():
            if global_step is None:
                return None
            return global_step.assign_add(tf.constant(1, global_step.dtype.base_dtype),
                                          read_value=False)
        done = run_every_k(applied, lambda: update(pairs, global_step, name), count_step)
        return done if tf.executing_eagerly() else done.op

    def _start_of(self, var):
        """The variable holding var's value before the local update (made once; in a
        TF1 graph a local variable, so not checkpointed)."""
        key = var.ref()
        if key not in self._starts:
            name = var.name.split(":")[0].replace("/", "_") + "_adasum_start"
            self._starts[key] = _local_variable(var.shape, var.dtype.base_dtype, name)
        return self._starts[key]

    def _apply_adasum(self, grads_and_vars, global_step=None, name=None):
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            raise ValueError("DistributedOptimizer(op=Adasum): no gradients to apply")
        variables = [v for _, v in pairs]
        starts = [self._start_of(v) for v in variables]
        saved = [s.assign(v.read_value(), read_value=False) for s, v in zip(starts, variables)]
        # The wrapped optimizer's update ops consume the gradients, so passing them
        # through identities that wait for the saves orders update after save.
        with tf.control_dependencies([op for op in map(_as_op, saved) if op is not None]):
            pairs = [(_after_deps(g), v) for g, v in pairs]
        applied = _as_op(self._optimizer.apply_gradients(pairs, global_step, name))
        # Every read of the starts waits for the update (hence for the saves): an
        # unordered read could see the previous step's values.
        with tf.control_dependencies([applied] if applied is not None else []):
            befores = [s.read_value() for s in starts]
            deltas = [v.read_value() - b for b, v in zip(befores, variables)]
        args = dict(self._reduce_args, sparse_as_dense=True)  # the deltas are dense anyway
        reduced = reduce_gradients(deltas, variables, **args)
        updates = [v.assign(b + d, read_value=False)
                   for b, v, d in zip(befores, variables, reduced)]
        return None if tf.executing_eagerly() else tf.group(*updates)

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
                         num_groups=0, groups=None, process_set=mpi_ops.global_process_set,
                         scale_local_gradients=True):
    """Wraps a tf.compat.v1.train.Optimizer (TF1 graphs) so that its gradients are
    averaged over the ranks; with op=Adasum its updates are combined by Adasum
    instead (the module's doc). A Keras optimizer is handed to
    perseus.tensorflow.keras.DistributedOptimizer, as Horovod does (which does not pass
    `op` on: here any op but Average is refused for it rather than dropped)."""
    op = mpi_ops._resolve_op(op, None)
    # Refused here rather than at the first apply: Adasum has no predivision.
    scale_factors(op, gradient_predivide_factor)
    groups = resolve_groups(num_groups, groups)
    legacy = getattr(tf.keras.optimizers, "legacy", None)  # Keras 2's OptimizerV2 classes
    keras_kinds = (tf.keras.optimizers.Optimizer,) + ((legacy.Optimizer,) if legacy else ())
    if isinstance(optimizer, keras_kinds):
        if op == mpi_ops.Adasum:
            raise ValueError("op == Adasum is not supported yet with Keras")  # Horovod's text
        if op != mpi_ops.Average:
            raise ValueError("perseus.tensorflow.horovod.DistributedOptimizer of a Keras "
                             "optimizer averages, as Horovod's (which drops op=); for op=%s "
                             "use perseus.tensorflow.keras.DistributedOptimizer"
                             % _ops.REDUCE_OP_NAMES[op])
        from perseus.tensorflow.keras.optimizer import DistributedOptimizer as keras_optimizer
        return keras_optimizer(
            optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients)
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError("Provided optimizer doesn't inherit from either legacy TensorFlow or "
                         "Keras optimizer: %s" % optimizer)  # Horovod's text
    return _DistributedOptimizer(optimizer, name, use_locking, dict(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients),
        check_passes(backward_passes_per_step),
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
