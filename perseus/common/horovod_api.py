"""The framework-neutral part of Horovod's API, re-exported by every front end's
``horovod`` module (``from perseus.common.horovod_api import *``): initialisation,
ranks, what was built, timeline, errors and process sets."""

from perseus.common.basics import (
    ccl_built,
    config,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    lane_count,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from perseus.common.exceptions import HorovodInternalError
from perseus.common.gpu import gpu_available
from perseus.common.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)

__all__ = [
    "ccl_built", "config", "cross_rank", "cross_size", "cuda_built", "ddl_built", "gloo_built",
    "gloo_enabled", "init", "is_homogeneous", "is_initialized", "lane_count", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank",
    "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline", "HorovodInternalError",
    "ProcessSet", "add_process_set", "global_process_set", "remove_process_set", "gpu_available",
]
