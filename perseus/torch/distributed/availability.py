"""What torch.distributed's availability checks answer on Perseus: the transports this
process has, not what the installed torch was built with. A script that picks its
backend from them (`"nccl" if dist.is_nccl_available() else "gloo"`) gets a name
init_process_group() accepts either way; every name runs on Perseus's MPI and NCCL."""

import os

from perseus.common import basics as _basics
from perseus.torch.ops import backend_names as _backend_names


def is_available():
    return True


def is_mpi_available():
    """True: Perseus always runs on MPI (CPU tensors and the control plane)."""
    return _basics.mpi_built()


def is_nccl_available():
    """True when NCCL and the CUDA runtime load in this process (GPU tensors go over NCCL)."""
    return bool(_basics.nccl_built())


def is_gloo_available():
    """False: Perseus has no gloo; init_process_group('gloo') runs on MPI all the same."""
    return _basics.gloo_built()


def is_torchelastic_launched():
    """Whether torchrun (torch.distributed.elastic) started this process, by its
    TORCHELASTIC_RUN_ID, as torch answers. Perseus's ranks come from mpirun, and
    init_process_group() refuses a world that torchrun split into one per process."""
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


_CHECKS = {"gloo": is_gloo_available, "nccl": is_nccl_available, "mpi": is_mpi_available}


def is_backend_available(backend):
    """As torch answers it, from the checks above: "gloo", "nccl" and "mpi" by
    is_*_available(), any other name by whether torch knows it (they all run on
    Perseus); a per-device string ("cpu:mpi,cuda:nccl") when each of its names is."""
    names = [part.rpartition(":")[2].strip().lower() for part in str(backend).split(",")]
    return all(_CHECKS[name]() if name in _CHECKS else name in _backend_names.known()
               for name in names)
