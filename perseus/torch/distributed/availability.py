"""What torch.distributed's availability checks answer on Perseus: the transports this
process has, not what the installed torch was built with. A script that picks its
backend from them (`"nccl" if dist.is_nccl_available() else "gloo"`) gets a name
init_process_group() accepts either way; every name runs on Perseus's MPI and NCCL."""

import os

from perseus.common import basics as _basics


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
