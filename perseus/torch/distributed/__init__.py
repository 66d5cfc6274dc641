"""torch.distributed look-alike on Perseus: ``import perseus.torch.distributed as dist``.

A torch DDP script runs under ``mpirun -np N`` with this import and
``perseus.torch.nn.parallel.DistributedDataParallel`` in place of torch's:
init_process_group() takes ranks from MPI (accepting, and warning once about, a
script's own --dist-url / --world-size / --rank), and the collectives keep torch's
signatures and in-place semantics.

Only re-exports; the code lives in process_group.py (init, ranks, groups) and
collectives.py (the collectives), over the torch operations layer (perseus/torch/ops/:
ReduceOp in reduce_ops.py, async results in work.py).
"""

from perseus.torch.distributed.collectives import (
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    broadcast_object_list,
    broadcast_optimizer_state,
    reduce_scatter_tensor,
)
from perseus.torch.distributed.process_group import (
    ProcessGroup,
    destroy_process_group,
    get_backend,
    get_local_rank,
    get_local_size,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_available,
    is_initialized,
    new_group,
)
from perseus.torch.ops.reduce_ops import ReduceOp
from perseus.torch.ops.work import Work

# Scripts test this to switch to Perseus's launch model (ranks from mpirun).
use_perseus = True

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "broadcast_optimizer_state",
    "destroy_process_group",
    "get_backend",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "is_available",
    "is_initialized",
    "new_group",
    "ProcessGroup",
    "reduce_scatter_tensor",
    "ReduceOp",
    "use_perseus",
    "Work",
]
