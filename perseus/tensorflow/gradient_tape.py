"""DistributedGradientTape: a tf.GradientTape whose gradient() averages over ranks."""

import tensorflow as tf

from perseus.tensorflow import mpi_ops
from perseus.tensorflow.compression import Compression
from perseus.tensorflow.gradients import reduce_gradients


class _DistributedGradientTape(tf.GradientTape):
    """Takes over an existing tape's state (what it recorded, or will record when
    used as a context manager), so wrapping before or after `with` both work."""

    def __init__(self, tape, compression, sparse_as_dense, op, gradient_predivide_factor,
                 num_groups, groups, process_set, local_sources=()):
        self.__dict__.update(tape.__dict__)
        self._perseus = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                             gradient_predivide_factor=gradient_predivide_factor,
                             num_groups=num_groups, groups=groups, process_set=process_set)
        self._local_sources = {id(v) for v in local_sources}

    def register_local_source(self, source):
        """Leaves `source`'s gradient local (not reduced), e.g. a per-rank layer."""
        self._local_sources.add(id(source))

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        skip = {i for i, s in enumerate(flat_sources) if id(s) in self._local_sources}
        reduced = reduce_gradients(flat_grads, flat_sources, skip=skip, **self._perseus)
        return tf.nest.pack_sequence_as(grads, reduced, expand_composites=False)


def DistributedGradientTape(gradtape, device_dense='', device_sparse='',
                            compression=Compression.none, sparse_as_dense=False,
                            op=mpi_ops.Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=mpi_ops.global_process_set):
    """Wraps `gradtape` so that gradient() returns gradients averaged over the ranks
    of `process_set` (op=Sum sums them). device_dense/device_sparse are accepted for
    Horovod compatibility (Perseus reduces host tensors)."""
    return _DistributedGradientTape(gradtape, compression, sparse_as_dense, op,
                                    gradient_predivide_factor, num_groups, groups, process_set)


def PartialDistributedGradientTape(gradtape, device_dense='', device_sparse='',
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=mpi_ops.Average, gradient_predivide_factor=1.0,
                                   num_groups=0, groups=None,
                                   process_set=mpi_ops.global_process_set, local_layers=None):
    """DistributedGradientTape that leaves the gradients of `local_layers`' variables
    (a Keras layer or a list of them) local to each rank."""
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    local = [v for layer in local_layers for v in layer.trainable_weights]
    return _DistributedGradientTape(gradtape, compression, sparse_as_dense, op,
                                    gradient_predivide_factor, num_groups, groups, process_set,
                                    local)
