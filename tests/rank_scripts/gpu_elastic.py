"""A rank killed while a GPU allreduce is in flight, the others going on (issue 46, point
5): hvd.elastic.run on Open MPI 5 with ULFM (mpirun --with-ft ulfm), CUDA tensors over
NCCL. Run by tests/mpi/test_fault_tolerance.py (the fake GPU) and scripts/gpu_elastic_check.sh.

Two ways to run it:
  * on the fake CUDA runtime and NCCL (FAKE_GPU_LIB set), built against Open MPI 5: a
    "CUDA tensor" is a CPU tensor that says it is on cuda:0 and torch's current stream
    is a fake stream (as tests/rank_scripts/gpu_torch_p2p.py). The victim is killed by
    the fake NCCL itself (FAKE_NCCL_DIE_RANK, FAKE_NCCL_DIE_AT_ALLREDUCE): SIGKILL as
    its n-th ncclAllReduce starts, so the survivors are inside the same kernel, waiting
    for a peer that never comes, as on a real GPU.
  * on a real GPU (no FAKE_GPU_LIB; scripts/gpu_check.sh's elastic check): every rank
    on cuda:0 (NCCL_MULTI_RANK_GPU_ENABLE=1), the victim (PTEST_VICTIM, default the last
    rank) SIGKILLs itself from a thread while its step's allreduce is in flight, at step
    PTEST_KILL_STEP.

Where the fake NCCL kills the victim is the fake's choice (tests/gpu_fakes/fake_nccl.c):
FAKE_NCCL_DIE_AT_INIT=<rank>:<n> as its n-th communicator creation starts (the first is
its device lane's, at the first GPU batch: the others inside theirs), and with
PTEST_GPU_P2P=1 (each step then also sends a CUDA tensor round the ring, point to point:
over NCCL, a communicator per pair) FAKE_NCCL_DIE_AT_P2P=<rank>:<n> as its n-th ncclSend
or ncclRecv starts (its peer inside the matching call). PTEST_FAILURES: how many ranks
die in all (default 1), one reset each.

Each step allreduces (Sum, prescaled by 0.5: exact) a tensor whose values depend on the rank and the step,
inside hvd.elastic.run, committing after every step. The survivors must raise
HorovodInternalError (never hang: the lanes' NCCL communicators are aborted), recover
(a world of 3), and finish every step, each result checked against numpy over the
ranks of that step's world; at the end the committed running total is checked against
numpy too (a CPU allreduce between each result and its commit: on a real GPU the
values of an aborted kernel are undefined, and the failure shows at the next
collective), and the fake saw no misuse (ncclCommDestroy of a broken communicator, a call
on an aborted one). Each survivor prints "gpu survivor ok, size <n>".
"""
import os
import signal
import threading
import time

import numpy as np
import torch

from common import launcher_rank_size, log, main
from support import fake_gpu
from support.fake_torch_cuda import FakeCudaTensor, use_fake_current_stream

import perseus.torch.horovod as hvd
from perseus.torch.ops import torch_api

STEPS, N = 8, 1000
FAKE = bool(os.environ.get("FAKE_GPU_LIB"))
P2P = os.environ.get("PTEST_GPU_P2P") == "1"


STREAM = None


def setup_device():
    global STREAM
    if FAKE:
        STREAM = use_fake_current_stream()  # what perseus asks torch
    else:
        torch.cuda.set_device(0)  # every rank on one GPU


def value(rank, step):
    """What `rank` contributes at `step` (float64 numpy; exact in float32)."""
    return ((np.arange(N) * 3 + rank * 7 + step * 11) % 101).astype(np.float64)


def device_tensor(values):
    cpu = torch.from_numpy(values.astype(np.float32))
    if not FAKE:
        return cpu.cuda()
    t = torch.Tensor._make_subclass(FakeCudaTensor, torch.empty_like(cpu))
    t.as_subclass(torch.Tensor).copy_(cpu)
    fake_gpu.kernel(0, STREAM, write=(t.data_ptr(), t.numel() * 4))  # written on the stream
    return t


def host(t):
    if not FAKE:
        return t.cpu().numpy().astype(np.float64)
    fake_gpu.kernel(0, STREAM, read=(t.data_ptr(), t.numel() * 4))
    fake_gpu.host_sync(0, STREAM)
    fake_gpu.host_read(t.data_ptr(), t.numel() * 4)
    return t.as_subclass(torch.Tensor).clone().numpy().astype(np.float64)


def ring_exchange(step):
    """Sends a CUDA tensor to the next rank and receives one from the previous, even
    ranks sending first (the fake's NCCL calls block their thread until the peer's are
    made: no cycle). The received values are checked against the sender's."""
    rank, size = hvd.rank(), hvd.size()
    if size < 2:
        return
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    out = device_tensor(value(rank, step) + 1000)
    got = device_tensor(np.zeros(N))
    sends = lambda: torch_api.send(out, nxt, 3, hvd.global_process_set).wait()
    recvs = lambda: torch_api.recv(got, prv, 3, hvd.global_process_set).wait()
    for call in ((sends, recvs) if rank % 2 == 0 else (recvs, sends)):
        call()
    received = host(got)
    assert np.array_equal(received, value(prv, step) + 1000), "step %d: from rank %d got %s" % (
        step, prv, received[:6])


def kill_soon():
    """The real-GPU victim: its stream is kept busy (about half a second) so that its
    step's NCCL kernel has not started when a thread SIGKILLs it 50 ms later, the
    others' kernels waiting for it (the fake NCCL kills its victim itself, inside the
    kernel)."""
    torch.cuda._sleep(1_000_000_000)

    def later():
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=later, daemon=True).start()


def body():
    world_rank, world_size = launcher_rank_size()
    hvd.init()
    setup_device()
    victim = int(os.environ.get("PTEST_VICTIM", world_size - 1))
    kill_step = int(os.environ.get("PTEST_KILL_STEP", "4"))
    state = hvd.elastic.TorchState(step=0, total=np.zeros(N), sizes=[])
    seen = {"failures": 0, "start": None}

    def on_reset():
        seen["failures"] += 1
        log("reset: now rank %d of %d, from step %d" % (hvd.rank(), hvd.size(), state.step))

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            if not FAKE and world_rank == victim and state.step == kill_step:
                kill_soon()
            t = device_tensor(value(hvd.rank(), state.step))
            # Scaled: on NCCL a PreMulSum operator, made and destroyed around the call
            # (never destroyed after its communicator was aborted: it went with it).
            hvd.allreduce_(t, name="gpu.elastic.step", op=hvd.Sum, prescale_factor=0.5)
            got = host(t)
            # On a real GPU the request completed when its kernel was queued: a kernel
            # aborted after a failure leaves undefined values, and the failure shows at
            # the next collective. So a CPU collective comes between the result and the
            # commit (a training loop's loss allreduce does the same).
            if P2P:
                ring_exchange(state.step)
            hvd.allreduce(torch.zeros(1), name="gpu.elastic.fence")
            expected = 0.5 * sum(value(r, state.step) for r in range(hvd.size()))
            assert np.array_equal(got, expected), "step %d at size %d: got %s, expected %s" % (
                state.step, hvd.size(), got[:6], expected[:6])
            state.total = state.total + got
            state.sizes = state.sizes + [hvd.size()]
            state.step += 1
            state.commit()

    start = time.monotonic()
    train(state)
    failures = int(os.environ.get("PTEST_FAILURES", "1"))
    assert seen["failures"] == failures, "resets: %d (expected %d)" % (seen["failures"], failures)
    assert hvd.size() == world_size - failures, (hvd.size(), world_size)
    assert len(state.sizes) == STEPS and state.sizes[-1] == world_size - failures, state.sizes
    # The committed total: each step's sum over the ranks of the world it ran in.
    reference = sum(0.5 * sum(value(r, s) for r in range(size)) for s, size in enumerate(state.sizes))
    assert np.array_equal(state.total, reference), "the running total differs from numpy's"
    fake_gpu.check_no_misuse("rank %d" % hvd.rank())
    log("gpu survivor ok, size %d, %.1f s" % (hvd.size(), time.monotonic() - start))
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
