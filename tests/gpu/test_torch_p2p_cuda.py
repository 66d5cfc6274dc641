"""Point-to-point of CUDA tensors on the "perseus" torch backend (issue 48, part 2):
tests/rank_scripts/gpu_torch_p2p.py at np 2 and 3 on the fake CUDA runtime and NCCL
(tests/gpu_fakes), whose NCCL moves each message between the ranks and fails a send and
a receive that do not meet, and whose ordering checker fails a message not ordered with
the framework's stream; and on real GPUs where torch sees two or more."""
import pytest
import torch

pytestmark = pytest.mark.timeout(240)


# A message the fake's device model can never finish fails within this.
DEVICE_TIMEOUT = {"FAKE_GPU_DEVICE_TIMEOUT_S": "30"}


@pytest.mark.parametrize("nprocs", [2, 3])
def test_point_to_point_of_cuda_tensors_on_fake_gpu(run_mpi, fake_gpu, nprocs):
    """send/recv of 10 dtypes x 5 shapes around the ring, tags out of order on either
    side of a pair, every pair at once, batch_isend_irecv, a group; refused on the
    caller: a receive from any rank, a send to itself, a peer outside the group, a dtype
    Perseus lacks, a non-contiguous receive, sizes that differ (on both sides, each
    naming both); the group's timeout ends a receive nobody sends to, on the pair's
    leader and on its follower, and the tag works afterwards."""
    run_mpi("gpu_torch_p2p", nprocs, env=dict(fake_gpu, **DEVICE_TIMEOUT), timeout=180)


@pytest.mark.parametrize("setup, env", [
    ("shared_gpu", {"FAKE_GPU_PCI_BUS_ID": "shared"}),  # the fake's NCCL 2.23 refuses it
    ("mpi_operations", {"PERSEUS_GPU_OPERATIONS": "mpi"}),
], ids=["shared_gpu", "mpi_operations"])
def test_a_message_nccl_cannot_carry_fails_on_both_ranks(run_mpi, fake_gpu, setup, env):
    """Where NCCL cannot carry a message (two ranks on one GPU with an NCCL that refuses
    it; GPU operations over MPI), the send and the receive each fail saying why."""
    run_mpi("gpu_torch_p2p", 2, env=dict(fake_gpu, P2P_REFUSED=setup, **DEVICE_TIMEOUT, **env), timeout=120)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (NCCL: a GPU per rank)")
def test_point_to_point_of_cuda_tensors_on_real_gpus(run_mpi):
    run_mpi("gpu_torch_p2p", 2, timeout=180)
