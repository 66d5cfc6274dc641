"""torch on the fake GPU (tests/gpu_fakes/), for rank scripts that hand perseus CUDA
tensors without a GPU: a tensor class that says it is on cuda:0, and torch's current
stream made one of the fake runtime's, as perseus asks torch for it."""
import torch

from support import fake_gpu


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it is on cuda:0, for the fake runtime; torch's own ops on
    it see (and return) plain CPU tensors."""
    __torch_function__ = torch._C._disabled_torch_function_impl
    device = property(lambda self: torch.device("cuda", 0))
    is_cuda = property(lambda self: True)
    is_cpu = property(lambda self: False)


class _Stream:
    def __init__(self, handle):
        self.cuda_stream = handle


def use_fake_current_stream():
    """Makes torch.cuda.current_stream() a new stream of the fake runtime on device 0,
    and returns its handle (for fake_gpu.kernel and host_sync)."""
    handle = fake_gpu.new_stream(0, "torch current stream")
    current = _Stream(handle)
    torch.cuda.current_stream = lambda device=None: current
    return handle
