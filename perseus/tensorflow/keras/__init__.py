"""Horovod's Keras API on Perseus: ``import perseus.tensorflow.keras as hvd``
(also ``perseus.keras``). Works with Keras 3 (tf.keras) and with Keras 2 (tf-keras)
under TF_USE_LEGACY_KERAS=1."""

import tensorflow as tf

from perseus.common.horovod_api import *  # noqa: F401,F403 (init, ranks, *_built, timeline, process sets)
from perseus.tensorflow import mpi_ops as _tf
from perseus.tensorflow.horovod import (  # noqa: F401 (re-exports)
    Adasum,
    Average,
    Compression,
    Max,
    Min,
    Product,
    Sum,
    allgather_object,
    alltoall,
    barrier,
    broadcast_object,
    broadcast_variables,
    grouped_allreduce,
    join,
)
from perseus.tensorflow.keras import callbacks, elastic  # noqa: F401
from perseus.tensorflow.keras.optimizer import (  # noqa: F401
    DistributedOptimizer,
    PartialDistributedOptimizer,
    load_model,
)
from perseus.tensorflow.keras.sync_batch_norm import SyncBatchNormalization  # noqa: F401


# Horovod's Keras collectives take a value (a tensor, array or number) in their own
# argument order, not the TensorFlow module's.

def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none):
    """`value` reduced over every rank (default: Average)."""
    return _tf.allreduce(tf.convert_to_tensor(value), average=average, compression=compression,
                         op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, name=name)


def allgather(value, name=None):
    """Every rank's `value` concatenated along dim 0."""
    return _tf.allgather(tf.convert_to_tensor(value), name=name)


def broadcast(value, root_rank, name=None):
    """root_rank's `value` on every rank."""
    return _tf.broadcast(tf.convert_to_tensor(value), root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    """`value` reduced over every rank; this rank's rows of dim 0."""
    return _tf.reducescatter(tf.convert_to_tensor(value), op=op, name=name)


def broadcast_global_variables(root_rank):
    raise RuntimeError("broadcast_global_variables is for TF1 graphs; in Keras use "
                       "callbacks.BroadcastGlobalVariablesCallback(root_rank) or "
                       "hvd.broadcast_variables(model.variables, root_rank)")
