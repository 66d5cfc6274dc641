"""The torch.distributed backend "perseus" (issue 38).

Multi-process: tests/rank_scripts/torch_backend.py at np 2 and 4 (torch's collectives against
references, DDP over perseus against DDP over gloo to the bit, FSDP2 against one
process, ZeroRedundancyOptimizer against Adam, mismatches and refused operations).
Here: a plain `python` process, a world of one.
"""
import subprocess
import sys

import pytest

from support.jobs import REPO_ROOT, clean_env


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [2, 4])
def test_torch_api_ddp_fsdp_zero(run_mpi, nprocs):
    run_mpi("torch_backend", nprocs)


@pytest.mark.mpi
@pytest.mark.timeout(200)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_point_to_point(run_mpi, nprocs):
    """Issue 48 (2): tests/rank_scripts/torch_p2p.py: send/recv/isend/irecv of 8 dtypes and
    5 shapes around the ring, tags, any source, batch_isend_irecv, objects, a group;
    sizes that differ, a bad peer and the group's timeout are errors, never hangs."""
    run_mpi("torch_p2p", nprocs, timeout=150)


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [2, 4])
def test_faults_end_in_errors_never_crashes_or_hangs(run_mpi, nprocs):
    """Issue 48 (1): tests/rank_scripts/torch_backend_faults.py: init/destroy loops, a
    refused call retried, different collectives at one turn, the group's timeout, torch's
    DDP when a bucket allreduce fails (it segfaulted), and the messages of a missing
    new_group and a set removed elsewhere."""
    run_mpi("torch_backend_faults", nprocs, timeout=150,
            env={"PERSEUS_STALL_CHECK_TIME_SECONDS": "1",
                 "PERSEUS_STALL_SHUTDOWN_TIME_SECONDS": "3"})


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_calls_gloo_has(run_mpi, nprocs):
    """Issue 48 (2): tests/rank_scripts/torch_backend_gloo_calls.py: all_gather_coalesced,
    sparse all_reduce and monitored_barrier as gloo does them, and barrier() under a
    new_group's timeout raising soon after it."""
    run_mpi("torch_backend_gloo_calls", nprocs, timeout=60)


WORLD_OF_ONE = r"""
import warnings
import torch
import torch.distributed as dist
import torch.nn as nn

import perseus.torch  # registers "perseus"

assert "perseus" in dist.Backend.backend_list
for round in range(2):  # again after destroy_process_group()
    dist.init_process_group("perseus")
    assert dist.get_backend() == "perseus"
    assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
    t = torch.arange(4.0)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert torch.equal(t, torch.arange(4.0))
    torch.manual_seed(0)
    plain = nn.Linear(3, 2)
    model = nn.parallel.DistributedDataParallel(nn.Linear(3, 2))
    model.module.load_state_dict(plain.state_dict())
    x = torch.randn(4, 3)
    for m in (plain, model):
        m(x).pow(2).sum().backward()
    for a, b in zip(plain.parameters(), model.module.parameters()):
        assert torch.equal(a.grad, b.grad), (a.grad, b.grad)
    try:
        dist.recv(t)  # from any rank (torch refuses a send to oneself before asking)
    except ValueError as e:
        assert "no other rank" in str(e), e
    else:
        raise AssertionError("recv in a world of one did not raise")
    dist.destroy_process_group()
import os
os.environ["WORLD_SIZE"] = "3"  # as torchrun sets it: not what MPI says
try:
    dist.init_process_group("perseus")
except RuntimeError as e:
    assert "WORLD_SIZE=3" in str(e) and "mpirun" in str(e), e
else:
    raise AssertionError("a world of one under WORLD_SIZE=3 did not raise")
print("ok")
"""


def test_world_of_one():
    result = subprocess.run([sys.executable, "-c", WORLD_OF_ONE], cwd=str(REPO_ROOT),
                            env=clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), \
        result.stdout + result.stderr


class _FakeWork:
    """What the future pool of perseus.torch.ops.work needs of a Work."""

    def __init__(self, value):
        import torch
        self._outputs = [torch.tensor([value])]
        self._future = self._source = torch.futures.Future()
        self._stream = None
        self._error = None

    def _complete(self):
        pass


def test_future_pool_callback_waiting_for_a_later_work():
    # PowerSGD's pattern on CUDA works: a then() callback, run by a pool thread, queues
    # another work and waits for its future, which only the pool completes. Without a
    # second thread the callback waits forever.
    import threading

    from perseus.torch.ops import work as work_module
    pool = work_module._Pool()
    first, second = _FakeWork(1.0), _FakeWork(2.0)

    def callback(future):
        pool.put(second)
        return future.value()[0] + second._future.wait()[0]

    chained = first._future.then(callback)
    pool.put(first)
    done = threading.Event()
    threading.Thread(target=lambda: (chained.wait(), done.set()), daemon=True).start()
    assert done.wait(30), "the pool did not complete a work queued by a callback"
    assert float(chained.value()) == 3.0
    assert pool._threads >= 2



FAILED_BUCKET = r"""
import torch
import torch.distributed as dist
import torch.nn as nn

import perseus.torch  # registers "perseus"
from perseus.torch.c10d import backend
from perseus.torch.ops import work

def failing(self, tensors, opts=None):  # every bucket's allreduce fails
    failed = work.Work(None, list(tensors))
    failed._done, failed._error = True, RuntimeError("the bucket allreduce failed")
    return failed

backend.ProcessGroupPerseus.allreduce = failing
dist.init_process_group("perseus")
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
try:
    model(torch.ones(3, 4)).sum().backward()
except RuntimeError as e:
    assert "the bucket allreduce failed" in str(e), e
    print("ok")
"""


def test_ddp_backward_raises_a_failed_bucket_allreduce():
    # Issue 48 (1): a Python future's set_exception() is a value to torch's C++ code,
    # which DDP's reducer read as the bucket's tensors: a segfault (exit code -11), in a
    # world of one as under mpirun. The error must reach backward() as a RuntimeError.
    result = subprocess.run([sys.executable, "-c", FAILED_BUCKET], cwd=str(REPO_ROOT),
                            env=clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), \
        "exit code %d\n%s%s" % (result.returncode, result.stdout, result.stderr)
