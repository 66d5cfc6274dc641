"""Horovod's MXNet API on Perseus: ``import perseus.mxnet as hvd``.

Only re-exports, under Horovod's names: perseus.common (init, ranks, process sets,
errors), perseus.mxnet.mpi_ops (collectives in MXNet's engine), .functions,
.optimizer (DistributedOptimizer, DistributedTrainer), .kvstore (create),
.sync_batch_norm (PerseusSyncBatchNorm) and its symbolic form.
"""

from perseus.common.horovod_api import *  # noqa: F401,F403
from perseus.common.horovod_api import __all__ as _common_all
from perseus.mxnet.compression import Compression
from perseus.mxnet.engine import shutdown  # waits for MXNet's pending ops first
from perseus.mxnet.kvstore import create
from perseus.mxnet.sync_batch_norm import PerseusSyncBatchNorm
from perseus.mxnet.sync_batch_norm_symbol import sync_batch_norm_symbol
from perseus.mxnet.functions import allgather_object, broadcast_object, broadcast_parameters
from perseus.mxnet.optimizer import DistributedOptimizer, DistributedTrainer
from perseus.mxnet.mpi_ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, allreduce_, alltoall,
    broadcast, broadcast_, grouped_allgather, grouped_allreduce, grouped_allreduce_,
    grouped_reducescatter, reducescatter,
)

__all__ = _common_all + [  # a plain sum: the docs read it without importing
    "Adasum", "Average", "Max", "Min", "Product", "Sum", "allgather", "allreduce", "allreduce_",
    "alltoall", "broadcast", "broadcast_", "grouped_allgather", "grouped_allreduce",
    "grouped_allreduce_", "grouped_reducescatter", "reducescatter", "Compression",
    "allgather_object", "broadcast_object",
    "broadcast_parameters", "DistributedOptimizer", "DistributedTrainer", "create",
    "PerseusSyncBatchNorm", "sync_batch_norm_symbol",
]
