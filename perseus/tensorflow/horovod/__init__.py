"""Horovod's TensorFlow API on Perseus: ``import perseus.tensorflow.horovod as hvd``.

Only re-exports, under Horovod's names: perseus.common (init, ranks, process sets,
errors, object broadcast), perseus.tensorflow.mpi_ops (collectives, eager and in
tf.function, with gradients), gradient_tape, functions and compat_v1 (TF1 graphs).
"""

from perseus.common.horovod_api import *  # noqa: F401,F403
from perseus.common.horovod_api import __all__ as _common_all
from perseus.tensorflow import elastic  # noqa: F401 (hvd.elastic)
from perseus.tensorflow.compat_v1 import BroadcastGlobalVariablesHook, DistributedOptimizer
from perseus.tensorflow.compression import Compression
from perseus.tensorflow.functions import (
    allgather_object,
    broadcast_,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from perseus.tensorflow.gradient_tape import (
    DistributedGradientTape,
    PartialDistributedGradientTape,
)
from perseus.tensorflow.sync_batch_norm import SyncBatchNormalization
from perseus.tensorflow.mpi_ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_broadcast,
    grouped_reducescatter,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    reducescatter,
    size_op,
)


# The public names (what `import *` gives, and what the API reference lists), with
# Horovod's submodule paths registered below.
__all__ = _common_all + [  # a plain sum: the docs read it without importing
    "Adasum", "Average", "Max", "Min", "Product", "Sum", "allgather", "allgather_object",
    "allreduce", "alltoall", "barrier", "broadcast", "broadcast_", "broadcast_global_variables",
    "broadcast_object", "broadcast_object_fn", "broadcast_variables",
    "BroadcastGlobalVariablesHook", "Compression",
    "DistributedGradientTape", "DistributedOptimizer", "elastic", "grouped_allgather",
    "grouped_allreduce", "grouped_broadcast", "grouped_reducescatter", "join",
    "local_rank_op", "local_size_op", "PartialDistributedGradientTape",
    "process_set_included_op", "rank_op", "reducescatter", "size_op", "SyncBatchNormalization",
    "compression", "functions", "gradient_aggregation", "gradient_aggregation_eager", "mpi_ops",
    "sync_batch_norm", "util",
]

# Horovod's submodule paths (horovod.tensorflow.mpi_ops, ...), holding these same objects.
from perseus.common.horovod_modules import add_submodules as _add_submodules  # noqa: E402

_add_submodules(__name__, ["mpi_ops", "compression", "functions", "gradient_aggregation",
                           "gradient_aggregation_eager", "sync_batch_norm", "util"],
                {"elastic": elastic})
