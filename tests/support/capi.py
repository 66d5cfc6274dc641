"""A small client of the C ABI (perseus.h) through perseus.common.library, with numpy
buffers and no framework. For tests that need requests no framework can make here:
GPU requests (device >= 0) on machines without CUDA, where a host pointer stands in
for device memory (the request must fail before it is touched, or a fake CUDA
runtime treats host memory as device memory: tests/gpu_fakes/fake_gpu.c).

On the fake, a GPU request behaves as a framework's would, for the fake's ordering
checker: a kernel on the request's stream (the producer) writes the input before
enqueue; after completion the consumer stream (the producer's unless given) is made
to wait for the request (perseus_stream_wait), a kernel on it reads the output, and
the host synchronises with it before reading. A race is raised at once, named.
"""
import ctypes
import zlib

import numpy as np

from support import fake_gpu
from perseus.common import library as lib

ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, JOIN = range(7)
AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT, BAND, BOR, BXOR = range(9)  # perseus_reduce_op_t
CPU = -1

# perseus_status_t
SUCCESS, INVALID_ARGUMENT, NOT_INITIALIZED, MISMATCH, SHUT_DOWN, MPI_ERROR, CONFIG_ERROR, \
    UNSUPPORTED, TIMEOUT, INTERNAL_ERROR, NON_FINITE = range(11)

# numpy has no bfloat16: a bfloat16 buffer is a uint16 array holding the bits.
BFLOAT16 = "bfloat16"
_CODES = {np.dtype(np.uint8): 0, np.dtype(np.int8): 1, np.dtype(np.int32): 2,
          np.dtype(np.int64): 3, np.dtype(np.float16): 4, np.dtype(np.float32): 6,
          np.dtype(np.float64): 7, np.dtype(np.bool_): 8, np.dtype(np.int16): 9}


class CoreError(Exception):
    def __init__(self, status, message):
        super().__init__("status %d: %s" % (status, message))
        self.status = status
        self.message = message


def last_error():
    raw = lib.perseus_last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def check(status):
    if status:
        raise CoreError(status, last_error())


def init():
    check(lib.perseus_init(-1))
    return rank(), size()


def shutdown():
    check(lib.perseus_shutdown())


def _get(fn):
    out = ctypes.c_int32()
    check(fn(ctypes.byref(out)))
    return out.value


def rank():
    return _get(lib.perseus_rank)


def size():
    return _get(lib.perseus_size)


def add_process_set(ranks):
    arr = (ctypes.c_int32 * len(ranks))(*ranks)
    out = ctypes.c_int32()
    check(lib.perseus_add_process_set(arr, len(ranks), ctypes.byref(out)))
    return out.value


def remove_process_set(set_id):
    check(lib.perseus_remove_process_set(set_id))


def config():
    return lib.perseus_config_string().decode()


def to_bf16(values):
    """float values -> bfloat16 bits (uint16), rounding to nearest even."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.asarray(bits, dtype=np.uint16)


def from_bf16(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def make(tag, rank, shape, dtype, low=-8, high=8):
    """A deterministic input of small integers (exact in every dtype and in every sum or
    average over up to 4 ranks); bfloat16 as bits."""
    rng = np.random.default_rng(zlib.crc32(("%s|%d" % (tag, rank)).encode()))
    if dtype == BFLOAT16:
        return to_bf16(np.asarray(rng.integers(low, high + 1, size=shape), dtype=np.float32))
    if np.dtype(dtype) == np.uint8:
        low, high = max(0, low), max(1, high)
    return np.asarray(rng.integers(low, high + 1, size=shape)).astype(dtype)


class Pending:
    """One enqueued request: keeps its buffers alive until wait()."""

    def __init__(self, handle, keep, output, dtype, device, consumer=None, name=""):
        self.handle = handle
        self.keep = keep
        self.output = output
        self.dtype = dtype
        self.device = device
        self.consumer = consumer  # GPU: the stream that reads the result (None: legacy)
        self.name = name
        self.status = None
        self.message = ""

    def _gpu_fake(self):
        return self.device != CPU and fake_gpu.lib() is not None

    def wait(self, timeout=60.0):
        """Waits for the handle; a GPU request's consumer stream then waits for its
        device work (failed requests too: work may have been queued before the failure)."""
        status = lib.perseus_wait(self.handle, timeout)
        self.status, self.message = status, (last_error() if status else "")
        if status == TIMEOUT:
            raise AssertionError("request still pending after %.0f s" % timeout)
        if self.device != CPU:  # the fake runtime accepts it; a no-op for CPU handles
            if self._gpu_fake():
                with fake_gpu.on_device(self.device):
                    check(lib.perseus_stream_wait(self.handle, self.consumer))
            else:
                check(lib.perseus_stream_wait(self.handle, self.consumer))
        return status, self.message

    def value(self, timeout=60.0):
        """Waits; raises CoreError on failure; returns the output (with received splits
        for alltoall). Releases the handle."""
        status, message = self.wait(timeout)
        try:
            if status:
                raise CoreError(status, message)
            if self.output is not None:
                self._consume(self.output.ctypes.data, self.output.nbytes)
                return self.output
            return self._take_output()
        finally:
            self.release()

    def _consume(self, address, nbytes):
        """A GPU result read by a kernel on the consumer stream, then by the host after
        synchronising with that stream."""
        if not self._gpu_fake():
            return
        fake_gpu.kernel(self.device, self.consumer, read=(address, nbytes))
        fake_gpu.host_sync(self.device, self.consumer)
        fake_gpu.host_read(address, nbytes)
        fake_gpu.check_no_misuse("request '%s'" % self.name)

    def _take_output(self):
        data = ctypes.c_void_p()
        shape = (ctypes.c_int64 * 16)()
        ndim = ctypes.c_int32()
        splits = ctypes.POINTER(ctypes.c_int64)()
        nsplits = ctypes.c_int32()
        check(lib.perseus_handle_output(self.handle, ctypes.byref(data), shape, ctypes.byref(ndim),
                                        ctypes.byref(splits), ctypes.byref(nsplits)))
        dims = tuple(shape[i] for i in range(ndim.value))
        storage = np.uint16 if self.dtype == BFLOAT16 else self.dtype
        out = np.empty(dims, dtype=storage)
        if out.nbytes:
            self._consume(data.value, out.nbytes)
            ctypes.memmove(out.ctypes.data, data.value, out.nbytes)
        recv = [splits[i] for i in range(nsplits.value)]
        if self._gpu_fake():
            with fake_gpu.on_device(self.device):
                check(lib.perseus_free_device_buffer(data, self.consumer))
        elif self.device != CPU:
            check(lib.perseus_free_device_buffer(data, self.consumer))
        else:
            lib.perseus_free_buffer(data)
        return (out, recv) if recv else out

    def release(self):
        if self.handle is not None:
            check(lib.perseus_release(self.handle))
            self.handle = None
        if self._gpu_fake():  # whatever the consumer did is done before memory is reused
            fake_gpu.host_sync(self.device, self.consumer)


def request(op_type, name, x=None, *, device=CPU, out=None, reduce_op=SUM, prescale=1.0,
            postscale=1.0, root=0, splits=None, process_set=0, dtype=None, stream=None,
            consumer=None):
    """A perseus_request_t and the buffers it points to. `x` (numpy, C-contiguous) is the
    input; `out` the output (default: a new array like x for allreduce and broadcast).
    GPU: `stream` produces the input (None: the legacy stream), `consumer` reads the
    result (default: `stream`)."""
    keep = []
    dtype = dtype or (x.dtype if x is not None else np.float32)
    code = 5 if dtype == BFLOAT16 else _CODES[np.dtype(dtype)]
    r = lib.Request()
    r.name = name.encode()
    r.op_type = op_type
    r.reduce_op = reduce_op
    r.dtype = code
    r.device = device
    r.prescale = prescale
    r.postscale = postscale
    r.root_rank = root
    r.process_set = process_set
    r.stream = stream
    if x is not None:
        assert x.flags["C_CONTIGUOUS"]
        shape = (ctypes.c_int64 * max(1, x.ndim))(*x.shape)
        keep += [x, shape]
        r.ndim = x.ndim
        r.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        r.input = x.ctypes.data
        if device != CPU and fake_gpu.lib() is not None and x.nbytes:
            fake_gpu.kernel(device, stream, write=(x.ctypes.data, x.nbytes))  # the producer
        if out is None and op_type in (ALLREDUCE, BROADCAST):
            out = np.empty_like(x)
        if out is not None:
            keep.append(out)
            r.output = out.ctypes.data
    if splits is not None:
        arr = (ctypes.c_int64 * len(splits))(*splits)
        keep.append(arr)
        r.splits = ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64))
        r.nsplits = len(splits)
    return r, keep, out, dtype, stream if consumer is None else consumer


def submit(*requests):
    """Enqueues requests (from request()) atomically; returns their Pending objects."""
    array = (lib.Request * len(requests))(*[r[0] for r in requests])
    handles = (ctypes.c_int64 * len(requests))()
    status = lib.perseus_enqueue(ctypes.addressof(array), len(requests), ctypes.addressof(handles))
    if status and fake_gpu.lib() is not None:  # refused: the producers' work is done with
        for r in requests:
            if r[0].device != CPU:
                fake_gpu.host_sync(r[0].device, r[0].stream)
    check(status)
    return [Pending(handles[i], r[1], r[2], r[3], r[0].device, r[4], r[0].name.decode())
            for i, r in enumerate(requests)]


def run(op_type, name, x=None, **kwargs):
    """Submits one request and returns its output (raises CoreError on failure)."""
    return submit(request(op_type, name, x, **kwargs))[0].value()


def outcome(op_type, name, x=None, **kwargs):
    """Submits one request and returns (status, message), releasing the handle."""
    pending = submit(request(op_type, name, x, **kwargs))[0]
    status, message = pending.wait()
    pending.release()
    return status, message
