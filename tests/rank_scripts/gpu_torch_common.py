"""What the torch CUDA scripts (tests/rank_scripts/gpu_torch_*.py) add to common.py: this rank's
GPU, and a way to keep a CUDA stream busy so that ordering mistakes show up as wrong
values.

PTEST_GPU picks the GPU as PTEST_DEVICE does in common.py: 'cuda' (this rank's own,
the default) or 'cuda:N' (every rank on GPU N: the host-staged run sharing one GPU).
PTEST_GPU=cpu runs the scripts' own logic on the CPU (busy() and stream checks do
nothing): a smoke test of the scripts on a machine without CUDA, not of the GPU path.
"""
import os

import torch

import common

_cycles_per_ms = None


def init(inputs_on_gpu):
    """hvd.init() and this rank's GPU -> (rank, size, device). inputs_on_gpu: make
    common.make_tensor() put inputs there (and common's checks expect results there);
    otherwise inputs stay on the CPU and the script moves what it needs."""
    rank, size = common.init()
    device = common.pick_device(os.environ.get("PTEST_GPU", "cuda"))
    if inputs_on_gpu:
        common.DEVICE = device
    return rank, size, device


def busy(ms):
    """Queues about `ms` milliseconds of GPU spinning on the current stream and returns
    at once. Work queued after it on that stream starts only when it ends, so a
    library that does not wait for the caller's stream reads stale inputs, and a
    caller that does not wait for the library reads stale results."""
    global _cycles_per_ms
    if not torch.cuda.is_available():
        return  # PTEST_GPU=cpu
    if _cycles_per_ms is None:
        # torch.cuda._sleep spins for a number of clock cycles: measure the clock once.
        cycles = 2_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)  # warm-up (module load)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _cycles_per_ms = cycles / max(start.elapsed_time(end), 1e-3)
    torch.cuda._sleep(int(ms * _cycles_per_ms))


def synchronize():
    """torch.cuda.synchronize(), or nothing under PTEST_GPU=cpu."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
