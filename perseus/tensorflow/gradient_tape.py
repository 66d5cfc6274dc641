"""DistributedGradientTape: a tf.GradientTape whose gradient() averages over ranks."""

import tensorflow as tf

from perseus.common.ops import check_predivide
from perseus.tensorflow import mpi_ops
from perseus.tensorflow.compression import Compression
from perseus.tensorflow.functions import variable_key
from perseus.tensorflow.gradients import reduce_gradients, resolve_groups


class _DistributedGradientTape(tf.GradientTape):
    """Takes over an existing tape's state (what it recorded, or will record when
    used as a context manager), so wrapping before or after `with` both work."""

    def __init__(self, tape, compression, sparse_as_dense, op, gradient_predivide_factor,
                 groups, process_set, local_sources=(), scale_local_gradients=True):
        self.__dict__.update(tape.__dict__)
        self._perseus = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                             gradient_predivide_factor=gradient_predivide_factor,
                             groups=groups, process_set=process_set,
                             scale_local_gradients=scale_local_gradients)
        self._local_sources = {variable_key(v) for v in local_sources}

    def register_local_source(self, source):
        """Leaves `source`'s gradient local (not reduced, divided by the set's size
        under scale_local_gradients), e.g. a per-rank layer's variable."""
        self._local_sources.add(variable_key(source))

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 **kwargs):
        """The gradients, reduced over the process set but for the local sources'.
        use_generic_names is Horovod's (names of its allreduce ops); Perseus does not
        name gradient requests after variables, so it changes nothing."""
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        skip = {i for i, s in enumerate(flat_sources) if self._is_local(s)}
        reduced = reduce_gradients(flat_grads, flat_sources, skip=skip, **self._perseus)
        if type(sources) is tuple:  # a list, as Horovod's (so grads[i] = ... works)
            return reduced
        return tf.nest.pack_sequence_as(grads, reduced, expand_composites=False)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        """(local, global), as Horovod: lists of (source, gradient) pairs in the order
        of `sources`, the local sources' as gradient() gives them (this rank's own,
        divided by the set's size under scale_local_gradients) and the others'
        reduced, e.g. to take their norms apart."""
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        local, reduced = [], []
        for source, grad in zip(tf.nest.flatten(sources),
                                tf.nest.flatten(grads, expand_composites=False)):
            (local if self._is_local(source) else reduced).append((source, grad))
        return local, reduced

    def _is_local(self, source):
        return variable_key(source) in self._local_sources


def DistributedGradientTape(gradtape, device_dense='', device_sparse='',
                            compression=Compression.none, sparse_as_dense=False,
                            op=mpi_ops.Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=mpi_ops.global_process_set,
                            scale_local_gradients=True):
    """Wraps `gradtape` so that gradient() returns gradients averaged over the ranks
    of `process_set` (op=Sum sums them). device_dense/device_sparse are accepted for
    Horovod compatibility (Perseus reduces host tensors)."""
    check_predivide(op, gradient_predivide_factor)  # here, as Horovod, not at gradient()
    groups = resolve_groups(num_groups, groups)
    return _DistributedGradientTape(gradtape, compression, sparse_as_dense, op,
                                    gradient_predivide_factor, groups, process_set,
                                    scale_local_gradients=scale_local_gradients)


def PartialDistributedGradientTape(gradtape, device_dense='', device_sparse='',
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=mpi_ops.Average, gradient_predivide_factor=1.0,
                                   num_groups=0, groups=None,
                                   process_set=mpi_ops.global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """DistributedGradientTape that leaves the gradients of `local_layers`' variables
    (a Keras layer or a list of them) local to each rank (divided by the set's size
    under scale_local_gradients, as Horovod)."""
    check_predivide(op, gradient_predivide_factor)
    groups = resolve_groups(num_groups, groups)
    return _DistributedGradientTape(gradtape, compression, sparse_as_dense, op,
                                    gradient_predivide_factor, groups, process_set,
                                    local_layer_variables(local_layers), scale_local_gradients)


def local_layer_variables(local_layers):
    """The trainable variables of `local_layers` (a Keras layer, a list of them, or
    None); ValueError for anything else, as Horovod."""
    if local_layers is None:
        return []
    if not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    for layer in local_layers:
        if not hasattr(layer, "trainable_weights"):
            raise ValueError("local_layers must be Keras layers, got %r" % (layer,))
    return [v for layer in local_layers for v in layer.trainable_weights]
