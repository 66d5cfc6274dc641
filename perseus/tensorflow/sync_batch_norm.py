"""SyncBatchNormalization: batch normalization whose batch statistics cover the
global batch (every rank of the process set), not just this rank's slice.

Training-mode moments come from two allreduces (sum and count, then the sum of
squared deviations), so the result equals BatchNormalization on the concatenated
batch; gradients flow through the allreduces. Inference uses the moving
statistics, which therefore agree on every rank.
"""

import tensorflow as tf

from perseus.common.process_sets import global_process_set
from perseus.tensorflow import mpi_ops


def _takes_fused():
    """Whether this Keras's BatchNormalization has `fused` (tf-keras, not Keras 3)."""
    import inspect
    return "fused" in inspect.signature(tf.keras.layers.BatchNormalization.__init__).parameters


class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """Horovod's signature: `fused` may be given as False (the default), never True
    (the fused kernel computes the moments itself); Keras 3's BatchNormalization has
    no `fused` argument at all, so it goes to tf-keras only."""

    def __init__(self, *args, fused=False, process_set=global_process_set, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=%s: its moments come "
                             "from allreduces, which the fused kernel cannot make" % (fused,))
        if _takes_fused():
            kwargs["fused"] = False
        super().__init__(*args, **kwargs)
        self._process_set = process_set

    def _moments(self, inputs, *args, **kwargs):
        # Keras 3: _moments(inputs, mask);
        # Keras 2: _moments(inputs, reduction_axes, keep_dims, mask=None).
        if len(args) + len(kwargs) <= 1:
            mask = args[0] if args else kwargs.get("mask")
            axes, keep_dims = self._reduction_axes, False
        else:
            names = ("reduction_axes", "keep_dims", "mask")
            given = dict(zip(names, args), **kwargs)
            axes, keep_dims, mask = (given["reduction_axes"], given["keep_dims"],
                                     given.get("mask"))
        if mask is not None:
            raise NotImplementedError("SyncBatchNormalization does not support masks")
        axes = list(axes)
        dtype = inputs.dtype
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), axes)), dtype)
        total, count = mpi_ops.grouped_allreduce(
            [tf.reduce_sum(inputs, axes, keepdims=True), tf.reshape(count, [1])],
            op=mpi_ops.Sum, process_set=self._process_set)
        mean = total / count
        squares = tf.reduce_sum(tf.square(inputs - mean), axes, keepdims=True)
        variance = mpi_ops.allreduce(squares, op=mpi_ops.Sum,
                                     process_set=self._process_set) / count
        if not keep_dims:
            mean = tf.squeeze(mean, axes)
            variance = tf.squeeze(variance, axes)
        return mean, variance
