"""torch.distributed look-alike on Perseus: ``import perseus.torch.distributed as dist``.

A torch DDP script runs under ``mpirun -np N`` with this import and
``perseus.torch.nn.parallel.DistributedDataParallel`` in place of torch's:
init_process_group() takes ranks from MPI (accepting, and warning once about, a
script's own --dist-url / --world-size / --rank), and the collectives keep torch's
signatures and in-place semantics.

Only re-exports; the code lives in process_group.py (init, ranks, groups),
availability.py (is_nccl_available and the like), subgroups.py (new_subgroups),
arguments.py (what `group` and rank arguments mean), collectives.py (the collectives)
and point_to_point.py (send, recv, ...), over the torch operations layer
(perseus/torch/ops/: ReduceOp in reduce_ops.py, async results in work.py).
"""

from torch.distributed import Backend  # the backend names, as torch's: they all run on Perseus
# torch's own, for scripts that name them here: the stores stand alone, the device's
# default backend is a name (it runs on Perseus), and the error classes are for except
# clauses (Perseus's failures are HorovodInternalError, a RuntimeError, as gloo's are).
from torch.distributed import (
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    FileStore,
    HashStore,
    PrefixStore,
    Store,
    TCPStore,
    get_default_backend_for_device,
)

from perseus.torch.distributed.availability import (
    is_available,
    is_backend_available,
    is_gloo_available,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
)
from perseus.torch.distributed.collectives import (
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    broadcast_object_list,
    broadcast_optimizer_state,
    gather,
    gather_object,
    monitored_barrier,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    scatter_object_list,
)
from perseus.torch.distributed.point_to_point import (
    P2POp,
    batch_isend_irecv,
    irecv,
    isend,
    recv,
    recv_object_list,
    send,
    send_object_list,
)
from perseus.torch.distributed.process_group import (
    GroupMember,
    ProcessGroup,
    destroy_process_group,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_local_rank,
    get_local_size,
    get_node_local_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_initialized,
    new_group,
)
from perseus.torch.distributed.subgroups import new_subgroups, new_subgroups_by_enumeration
from perseus.torch.ops.reduce_ops import ReduceOp
from perseus.torch.ops.work import Work

# Scripts test this to switch to Perseus's launch model (ranks from mpirun).
use_perseus = True

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "Backend",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "broadcast_optimizer_state",
    "destroy_process_group",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "FileStore",
    "gather",
    "gather_object",
    "get_backend",
    "get_default_backend_for_device",
    "get_global_rank",
    "get_group_rank",
    "get_local_rank",
    "get_local_size",
    "get_node_local_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "GroupMember",
    "HashStore",
    "init_process_group",
    "irecv",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "isend",
    "monitored_barrier",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "P2POp",
    "PrefixStore",
    "ProcessGroup",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "ReduceOp",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
    "Store",
    "TCPStore",
    "use_perseus",
    "Work",
]
