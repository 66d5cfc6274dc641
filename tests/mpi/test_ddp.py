"""Drop-in DDP: perseus.torch.distributed and perseus.torch.nn.parallel.DistributedDataParallel.

Multi-process: tests/rank_scripts/ddp.py (gradients equal torch's own DDP over gloo in the
same job), tests/rank_scripts/ddp_training.py (training equals single-process training,
join, groups, pickling, errors) and tests/rank_scripts/distributed_api.py (the collectives),
each at np 2 and 4. Single-process: the import paths, bucket assignment, and DDP
in a world of one.
"""
import socket
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from support.jobs import REPO_ROOT, clean_env

NPROCS = [2, 4]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The three scripts of an np in one job (tests/support/rank_batch.py): one mpirun and one
# torch import per rank instead of three. "ddp" last: it makes torch's own gloo group.
BATCH = ["ddp_training", "distributed_api", "ddp"]
PORTS = {}


def batch_env(nprocs):
    """The batch's variables, the same for its three tests (torch's gloo group's address)."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": PORTS.setdefault(nprocs, str(free_port()))}


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", NPROCS)
def test_gradients_equal_torch_ddp(run_mpi_batch, nprocs):
    run_mpi_batch("ddp", nprocs, BATCH, env=batch_env(nprocs), timeout=300)


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", NPROCS)
def test_training_join_and_errors(run_mpi_batch, nprocs):
    run_mpi_batch("ddp_training", nprocs, BATCH, env=batch_env(nprocs), timeout=300)


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", NPROCS)
def test_distributed_api(run_mpi_batch, nprocs):
    run_mpi_batch("distributed_api", nprocs, BATCH, env=batch_env(nprocs), timeout=300)


def test_import_perseus_then_attribute_access():
    # A fresh interpreter: nothing but `import perseus` before the attribute chain.
    code = ("import perseus\n"
            "assert perseus.torch.nn.parallel.DistributedDataParallel.__name__ == "
            "'DistributedDataParallel'\n"
            "assert perseus.torch.distributed.use_perseus is True\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=str(REPO_ROOT), env=clean_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_bucket_assignment():
    from perseus.torch.buckets import assign_buckets
    params = [torch.zeros(256), torch.zeros(256, dtype=torch.float64), torch.zeros(256),
              torch.zeros(256), torch.zeros(256)]
    # 1 KiB per float32 tensor: first bucket capped at 1 KiB, then 2 KiB; reverse order.
    buckets = assign_buckets(params, cap_bytes=2048, first_cap_bytes=1024)
    assert buckets == [[4], [3, 2], [1], [0]], buckets  # float64 #1 fills its own at once
    assert sorted(i for b in buckets for i in b) == list(range(len(params)))


def test_reduce_op_accepts_torch_values():
    import torch.distributed as tdist

    from perseus.common import ops
    from perseus.torch.ops.reduce_ops import ReduceOp, core_op
    assert core_op(ReduceOp.AVG) == ops.Average
    assert core_op(tdist.ReduceOp.SUM) == ops.Sum
    assert core_op(tdist.ReduceOp.MAX) == ops.Max
    assert core_op(tdist.ReduceOp(tdist.ReduceOp.BOR)) == ops.BOR
    with pytest.raises(NotImplementedError, match="PREMUL_SUM"):
        core_op(tdist.ReduceOp.PREMUL_SUM)
    with pytest.raises(TypeError, match="ReduceOp"):
        core_op("max")


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.bn = nn.BatchNorm1d(2)

    def forward(self, x):
        return self.bn(self.fc(x))


def test_ddp_world_of_one(initialized):
    from perseus.torch.nn.parallel import DistributedDataParallel
    torch.manual_seed(0)
    plain = _Net()
    model = DistributedDataParallel(_Net(), gradient_as_bucket_view=True)
    model.module.load_state_dict(plain.state_dict())
    x = torch.randn(8, 4)
    for m in (plain, model):
        m(x).pow(2).sum().backward()
    for a, b in zip(plain.parameters(), model.module.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert torch.equal(plain.bn.running_mean, model.module.bn.running_mean)
    with pytest.raises(ValueError, match="device_ids"):
        DistributedDataParallel(_Net(), device_ids=[0])
