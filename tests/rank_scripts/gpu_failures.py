"""Failures on the GPU path, on the fake CUDA runtime and NCCL of tests/gpu_fakes;
GPU_FAILURE picks the case:

  init      FAKE_NCCL_FAIL_INIT_RANK names a rank whose ncclCommInitRank fails: the
            batch fails on every rank with that rank's message; CPU work goes on.
  midway    (one rank) FAKE_NCCL_FAIL_ALLREDUCE_AFTER=1: the second NCCL allreduce
            fails; the lane aborts its communicator and fails later GPU batches
            clearly instead of hanging; CPU work goes on; nothing leaks.
  devices   (FAKE_CUDA_DEVICES=2) a second device in one process, or a device that
            does not exist, is refused at enqueue with the request's own error.
  operations  PERSEUS_GPU_OPERATIONS=mpi on the last rank only: init() fails on every
            rank naming the setting (ranks would take different paths).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import capi  # noqa: E402
from gpu_collectives import assert_fake_released  # noqa: E402
from support.rank_script import launcher_rank_size, log, main  # noqa: E402


def cpu_ok(size, tag):
    out = capi.run(capi.ALLREDUCE, tag, np.ones(4, dtype=np.float32))
    assert np.all(out == size), out


def gpu_outcome(name):
    x = np.ones(4, dtype=np.float32)
    return capi.outcome(capi.ALLREDUCE, name, x, device=0)


def case_init(rank, size):
    bad = int(os.environ["FAKE_NCCL_FAIL_INIT_RANK"])
    for name in ("first", "retried"):  # a failed opening is retried by every rank
        status, message = gpu_outcome(name)
        assert status == capi.INTERNAL_ERROR, (status, message)
        assert "rank %d: ncclCommInitRank failed" % bad in message, message
        assert "PERSEUS_GPU_OPERATIONS=mpi" in message, message
        cpu_ok(size, "cpu." + name)


def case_midway(rank, size):
    assert size == 1
    status, message = gpu_outcome("fine")
    assert status == 0, message
    status, message = gpu_outcome("breaks")
    assert status == capi.INTERNAL_ERROR and "ncclAllReduce failed" in message, (status, message)
    status, message = gpu_outcome("after")
    assert status == capi.INTERNAL_ERROR, (status, message)
    assert "stopped after a CUDA/NCCL failure" in message and "ncclAllReduce failed" in message, message
    cpu_ok(size, "cpu.after")


def case_devices(rank, size):
    status, message = capi.outcome(capi.ALLREDUCE, "on0", np.ones(2, np.float32), device=0)
    assert status == 0, message
    x = np.ones(2, np.float32)
    for device, words in ((1, "already uses cuda:0"), (5, "does not exist")):
        try:
            capi.run(capi.ALLREDUCE, "dev%d" % device, x, device=device)
        except capi.CoreError as e:
            assert e.status == capi.INVALID_ARGUMENT and words in e.message, e.message
        else:
            raise AssertionError("a request on cuda:%d was accepted" % device)
    cpu_ok(size, "cpu.devices")


def body():
    case = os.environ["GPU_FAILURE"]
    launcher_rank, launcher_size = launcher_rank_size()
    if case == "operations":
        if launcher_rank == launcher_size - 1:
            os.environ["PERSEUS_GPU_OPERATIONS"] = "mpi"
        try:
            capi.init()
        except capi.CoreError as e:
            assert e.status == capi.CONFIG_ERROR, e
            assert "PERSEUS_GPU_OPERATIONS differs across ranks" in e.message, e.message
        else:
            raise AssertionError("init() accepted differing PERSEUS_GPU_OPERATIONS")
        os.environ.pop("PERSEUS_GPU_OPERATIONS", None)
    rank, size = capi.init()
    cases = {"init": case_init, "midway": case_midway, "devices": case_devices,
             "operations": lambda rank, size: cpu_ok(size, "cpu.operations")}
    cases[case](rank, size)
    capi.shutdown()
    assert_fake_released()


if __name__ == "__main__":
    main(body)
