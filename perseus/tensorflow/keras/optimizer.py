"""DistributedOptimizer for Keras: the wrapped optimizer averages gradients over
the ranks before applying them, so model.compile(optimizer=...) + model.fit trains
data-parallel.

The wrapper is a dynamic subclass of the optimizer's own class, rebuilt from its
config, so it is still that optimizer to Keras (checks, serialization, slots).
Keras 3 routes every update through apply() (apply_gradients() calls it), so that
is where gradients are reduced; Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1) has no
apply(), and reduces in apply_gradients().
"""

import tensorflow as tf

from perseus.tensorflow import mpi_ops
from perseus.tensorflow.compression import Compression
from perseus.tensorflow.gradients import reduce_gradients


def _reduce_args(optimizer):
    return optimizer._perseus_reduce_args


class _Keras3Mixin:
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        variables = None if trainable_variables is None else list(trainable_variables)
        grads = reduce_gradients(grads, variables, **_reduce_args(self))
        return super().apply(grads, trainable_variables)


class _Keras2Mixin:
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        grads = reduce_gradients([g for g, _ in pairs], [v for _, v in pairs],
                                 **_reduce_args(self))
        return super().apply_gradients(list(zip(grads, [v for _, v in pairs])), *args, **kwargs)


def _is_keras3(optimizer):
    try:
        import keras
    except ImportError:
        return False
    return (getattr(keras, "__version__", "0").startswith("3")
            and isinstance(optimizer, keras.optimizers.Optimizer))


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=mpi_ops.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=mpi_ops.global_process_set,
                         scale_local_gradients=True):
    """Returns a copy of the Keras `optimizer` (same class and config) whose updates
    use gradients averaged over the ranks of `process_set`."""
    if backward_passes_per_step != 1:
        raise NotImplementedError("backward_passes_per_step > 1 is not supported by the Keras "
                                  "DistributedOptimizer in Perseus yet")
    mixin = _Keras3Mixin if _is_keras3(optimizer) else _Keras2Mixin
    base = type(optimizer)
    cls = type(base.__name__, (mixin, base), {"_perseus_distributed": True})
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    wrapped = cls.from_config(config)
    wrapped._perseus_reduce_args = dict(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
        groups=groups, process_set=process_set)
    return wrapped
