"""DistributedOptimizer for Keras: the wrapped optimizer averages gradients over
the ranks before applying them, so model.compile(optimizer=...) + model.fit trains
data-parallel.

The wrapper is a dynamic subclass of the optimizer's own class, rebuilt from its
config, so it is still that optimizer to Keras (checks, serialization, slots).
Keras 3 routes every update through apply() (apply_gradients() calls it), so that
is where gradients are reduced; Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1) has no
apply(), and reduces in apply_gradients(). With backward_passes_per_step > 1 the
same methods sum the gradients instead and reduce and apply only every k-th call
(perseus.tensorflow.gradient_accumulation).
"""

import tensorflow as tf

from perseus.tensorflow import mpi_ops
from perseus.tensorflow.compression import Compression
from perseus.tensorflow.gradient_accumulation import (GradientAccumulator, check_passes,
                                                      run_every_k)
from perseus.tensorflow.functions import variable_key
from perseus.tensorflow.gradient_tape import local_layer_variables
from perseus.tensorflow.gradients import reduce_gradients, resolve_groups


def _reduced(optimizer, grads, variables):
    """reduce_gradients with the optimizer's options; the gradients of its
    registered local variables (register_local_var) stay local."""
    local = optimizer.__dict__.get("_perseus_local_vars")
    skip = [i for i, v in enumerate(variables or ()) if variable_key(v) in local] if local else ()
    return reduce_gradients(grads, variables, skip=skip, **optimizer._perseus_reduce_args)


def _accumulator(optimizer):
    """The optimizer's GradientAccumulator, or None when it updates on every call."""
    passes, average = optimizer._perseus_passes
    if passes == 1:
        return None
    if "_perseus_accumulator" not in optimizer.__dict__:
        optimizer.__dict__["_perseus_accumulator"] = GradientAccumulator(
            passes, average, lambda grads, variables: _reduced(optimizer, grads, variables))
    return optimizer.__dict__["_perseus_accumulator"]


def _every_k(optimizer, accumulator, grads, variables, apply):
    """Adds the gradients; on every k-th call apply(reduced sums), else only counts
    the step in optimizer.iterations (as Horovod does)."""
    due = accumulator.add(grads, variables)
    return run_every_k(due, lambda: apply(accumulator.take(variables)),
                       lambda: optimizer.iterations.assign_add(1))


class _LocalVarsMixin:
    @property
    def _agg_helper(self):
        """Horovod's gradient-aggregation helper, which scripts and tests read
        (`_agg_helper.counter`: calls since the last reduction): the accumulator, or
        None when backward_passes_per_step is 1. Its counter exists from the first
        update on."""
        return _accumulator(self)

    def register_local_var(self, var):
        """Leaves `var`'s gradient local to this rank (not reduced; divided by the
        set's size under scale_local_gradients), as Horovod's register_local_var."""
        # Through __dict__: Keras would track (and wrap) a set assigned as attribute.
        self.__dict__.setdefault("_perseus_local_vars", set()).add(variable_key(var))


class _Keras3Mixin(_LocalVarsMixin):
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        variables = None if trainable_variables is None else list(trainable_variables)
        accumulator = _accumulator(self)
        if accumulator is None:
            if variables is None and self.built:
                variables = list(self._trainable_variables)
            grads = _reduced(self, grads, variables)
            return super().apply(grads, trainable_variables)
        if variables is None:
            if not self.built:
                raise ValueError("apply(grads) without variables needs a built optimizer; "
                                 "call optimizer.build(trainable_variables) first")
            variables = list(self._trainable_variables)
        elif not self.built:  # its slots must exist before the tf.cond below
            self.build(variables)
        base_apply = super().apply
        return _every_k(self, accumulator, grads, variables,
                        lambda reduced: base_apply(reduced, variables))


class _Keras2Mixin(_LocalVarsMixin):
    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Horovod's hook on tf-keras optimizers: the gradients of `loss` (a tensor
        recorded on `tape`, or a callable) for `var_list`, as (gradient, variable)
        pairs, reduced over the ranks; the apply_gradients() that follows applies
        them as they are. With backward_passes_per_step > 1 they are this rank's:
        apply_gradients() sums them and reduces every k-th call."""
        if callable(var_list):
            var_list = var_list()
        var_list = list(tf.nest.flatten(var_list))
        if tape is None:
            if not callable(loss):
                raise ValueError("_compute_gradients: a tensor loss needs the `tape` that recorded it")
            with tf.GradientTape() as tape:
                tape.watch(var_list)
                loss = loss()
        elif callable(loss):
            with tape:
                loss = loss()
        grads = tape.gradient(loss, var_list, grad_loss)
        if _accumulator(self) is None:
            grads = _reduced(self, list(grads), var_list)
            self.__dict__["_perseus_reduced"] = True  # (a Python flag: read where traced)
        return list(zip(grads, var_list))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        accumulator = _accumulator(self)
        if accumulator is None:
            if not self.__dict__.pop("_perseus_reduced", False):  # else _compute_gradients did
                grads = _reduced(self, grads, variables)
            return super().apply_gradients(list(zip(grads, variables)), *args, **kwargs)
        with tf.init_scope():  # slots must exist before the tf.cond below
            if hasattr(self, "_create_all_weights"):  # tf-keras' legacy optimizers
                self._create_all_weights(variables)
            else:
                self.build(variables)
        base_apply = super().apply_gradients
        return _every_k(self, accumulator, grads, variables,
                        lambda reduced: base_apply(list(zip(reduced, variables)), *args, **kwargs))


def _is_keras3_class(cls):
    try:
        import keras
    except ImportError:
        return False
    return (getattr(keras, "__version__", "0").startswith("3")
            and issubclass(cls, keras.optimizers.Optimizer))


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=mpi_ops.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=mpi_ops.global_process_set,
                         scale_local_gradients=True):
    """Returns a copy of the Keras `optimizer` (same class and config, fresh state)
    whose updates use gradients averaged over the ranks of `process_set`.

    backward_passes_per_step=k: gradients are summed locally over k calls and only
    every k-th call reduces them (divided by k if average_aggregated_gradients) and
    updates the variables; the other calls only advance optimizer.iterations."""
    passes = (check_passes(backward_passes_per_step), bool(average_aggregated_gradients))
    base = type(optimizer)
    while "_perseus_reduce_args" in vars(base):  # re-wrapping: start from the plain class
        base = base.__bases__[1]
    cls = distributed_class(base, _reduce_args(
        compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
        process_set, scale_local_gradients), passes)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


def PartialDistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=mpi_ops.Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=mpi_ops.global_process_set,
                                scale_local_gradients=True, local_layers=None):
    """DistributedOptimizer whose `local_layers`' variables (a Keras layer or a list
    of them) keep their gradients local to each rank (register_local_var)."""
    local = local_layer_variables(local_layers)
    distributed = DistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)
    for var in local:
        distributed.register_local_var(var)
    return distributed


def _reduce_args(compression=Compression.none, sparse_as_dense=False, op=mpi_ops.Average,
                 gradient_predivide_factor=1.0, num_groups=0, groups=None,
                 process_set=mpi_ops.global_process_set, scale_local_gradients=True):
    if op not in (mpi_ops.Average, mpi_ops.Sum, mpi_ops.Adasum):  # Adasum: ours (docs)
        raise ValueError("op currently only supports Average and Sum")  # Horovod's text
    return dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                gradient_predivide_factor=gradient_predivide_factor,
                groups=resolve_groups(num_groups, groups, stacklevel=4), process_set=process_set,
                scale_local_gradients=scale_local_gradients)


def distributed_class(base, reduce_args, passes=(1, False)):
    """The distributed subclass of the Keras optimizer class `base`. It keeps the
    base's name and module, so a saved model names the plain optimizer (loadable
    anywhere) and load_model() can map that name back to this class.
    passes: (backward_passes_per_step, average_aggregated_gradients)."""
    mixin = _Keras3Mixin if _is_keras3_class(base) else _Keras2Mixin
    return type(base.__name__, (mixin, base), {"__module__": base.__module__,
                                               "_perseus_reduce_args": reduce_args,
                                               "_perseus_passes": passes})


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, backward_passes_per_step=1,
               average_aggregated_gradients=False, **kwargs):
    """keras.models.load_model, with the saved optimizer restored (state included) as
    a DistributedOptimizer. custom_optimizers: optimizer classes beyond Keras' own.
    kwargs: DistributedOptimizer's reduction options (op, sparse_as_dense, ...)."""
    args = _reduce_args(compression=compression, **kwargs)
    passes = (check_passes(backward_passes_per_step), bool(average_aggregated_gradients))
    bases = [c for c in vars(tf.keras.optimizers).values()
             if isinstance(c, type) and issubclass(c, tf.keras.optimizers.Optimizer)]
    objects = {base.__name__: distributed_class(base, args, passes)
               for base in bases + list(custom_optimizers or [])}
    objects.update(custom_objects or {})
    return tf.keras.models.load_model(filepath, custom_objects=objects)
