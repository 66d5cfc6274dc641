"""Horovod's Keras API on Perseus: ``import perseus.tensorflow.keras as hvd``
(also ``perseus.keras``). Works with Keras 3 (tf.keras) and with Keras 2 (tf-keras)
under TF_USE_LEGACY_KERAS=1."""

from perseus.common.horovod_api import *  # noqa: F401,F403 (init, ranks, *_built, timeline, process sets)
from perseus.tensorflow.horovod import (  # noqa: F401 (re-exports)
    Adasum,
    Average,
    Compression,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_object,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    broadcast_object,
    broadcast_variables,
    grouped_allreduce,
    join,
    reducescatter,
)
from perseus.tensorflow.keras import callbacks, elastic  # noqa: F401
from perseus.tensorflow.keras.optimizer import (  # noqa: F401
    DistributedOptimizer,
    PartialDistributedOptimizer,
    load_model,
)
from perseus.tensorflow.keras.sync_batch_norm import SyncBatchNormalization  # noqa: F401


def broadcast_global_variables(root_rank):
    raise RuntimeError("broadcast_global_variables is for TF1 graphs; in Keras use "
                       "callbacks.BroadcastGlobalVariablesCallback(root_rank) or "
                       "hvd.broadcast_variables(model.variables, root_rank)")
