"""CUDA tensors in the torch adapter: what a GPU request adds to a CPU one.

  * the core is told once where torch's CUDA runtime and NCCL live
    (gpu.prepare(first="torch")) before the first CUDA request;
  * a request carries the tensor's device ordinal and the caller's current stream
    at enqueue: the core records its ready event there, so the collective reads
    the input only after the kernels that produce it;
  * at synchronize() the caller's current stream (then) waits on the device for
    the collective (requests.submit's consumer_stream): no host synchronisation;
  * core-allocated outputs (allgather, alltoall) are device memory from
    cudaMallocAsync. We copy them into a tensor of torch's caching allocator on the
    current stream and free the core's buffer at once, stream-ordered on that
    stream. Why a copy rather than a zero-copy view: a view's memory would be
    invisible to torch's allocator, so record_stream() could not protect it and a
    finalizer could not know which stream last used it; one device-to-device copy
    (cheap next to the collective that filled it) keeps every result an ordinary
    torch tensor. The copy is of bytes, so any dtype works (bool, bfloat16).

Nothing here runs for CPU tensors, and nothing needs a CUDA device to import.
"""

import math
import threading

import torch

from perseus.common import gpu as _gpu
from perseus.common import requests as _requests
from perseus.common.exceptions import HorovodInternalError

_ready = False
_lock = threading.Lock()
_consumers = {}  # device ordinal -> callable returning its current stream


def ordinal(tensor):
    """The CUDA ordinal of a non-CPU tensor, after making sure the core knows where
    torch's CUDA libraries are; NotImplementedError for other devices."""
    if not tensor.is_cuda:
        raise NotImplementedError("tensors on device %s are not supported" % tensor.device)
    if not _ready:
        _prepare_libraries()
    return tensor.device.index


def _prepare_libraries():
    global _ready
    with _lock:
        if _ready:
            return
        try:
            _gpu.prepare(first="torch")
        except ValueError:
            pass  # the core already loaded (or tried) its libraries from folders of its own
        _ready = True


def current_stream(index):
    """The caller's current stream on device `index` as an int (cudaStream_t)."""
    return torch.cuda.current_stream(index).cuda_stream


def consumer(index):
    """requests.submit's consumer_stream for device `index` (cached per device)."""
    fn = _consumers.get(index)
    if fn is None:
        fn = _consumers.setdefault(index, lambda: torch.cuda.current_stream(index).cuda_stream)
    return fn


class DeviceBytes:
    """`nbytes` of device memory at `address`, shown to torch.as_tensor through the
    CUDA array interface (v3) as a flat uint8 array. It owns nothing: the caller
    frees the memory. stream None: the consumer's stream has already waited (the
    interface's 'no synchronisation needed')."""

    def __init__(self, address, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "strides": None,
            "version": 3,
            "stream": None,
        }


def tensor_from_core(handle, dtype, index):
    """The core-allocated device output of a completed, stream-waited GPU handle as a
    torch tensor of `dtype` on cuda:index, and the received splits (alltoall) or None.
    The core's buffer is freed here, stream-ordered after the copy."""
    address, shape, recv = _requests.output_address(handle)
    device = torch.device("cuda", index)
    stream = current_stream(index)
    try:
        numel = math.prod(shape)
        if numel == 0:
            return torch.empty(shape, dtype=dtype, device=device), recv
        if not address:
            raise HorovodInternalError("the core returned no buffer for an output of shape %s"
                                       % (shape,))
        nbytes = numel * dtype.itemsize
        view = torch.as_tensor(DeviceBytes(address, nbytes), device=device)
        out = view.clone()  # on the current stream, into torch's allocator
        del view
        return out.view(dtype).view(shape), recv
    finally:
        if address:
            _requests.free_device_buffer(address, stream)
