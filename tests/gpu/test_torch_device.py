"""The torch adapter's CUDA branch, checked without a CUDA device: the requests a CUDA
tensor becomes (device ordinal, the caller's stream), the stream wait synchronize()
adds for them (and only for them), the CUDA array interface of core outputs, and the
arguments join() and DDP take. The GPU work itself: tests/gpu/test_gpu.py."""
import collections
import ctypes

import pytest
import torch

from perseus.common import library
from perseus.common import ops
from perseus.common import requests
from perseus.torch import adapter
from perseus.torch import device as torch_device
from perseus.torch import mpi_ops
from perseus.torch.nn.parallel import distributed as ddp


class FakeCudaTensor:
    """Just what adapter.prepare and the request building read of a CUDA tensor."""
    is_cpu = False
    is_cuda = True
    layout = torch.strided
    requires_grad = False  # in-place calls check it (autograd's rule for in-place ops)

    def __init__(self, index, shape=(3, 2), dtype=torch.float32, address=0xD000):
        self.device = torch.device("cuda", index)
        self.shape = torch.Size(shape)
        self.dtype = dtype
        self._address = address

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return self._address

    def untyped_storage(self):
        return self  # the adapter only keeps it referenced


@pytest.fixture
def captured(monkeypatch):
    """requests.submit replaced by a recorder of its arguments, the packed batch as
    its records (library.Request); streams are fake ints; the library folders count
    as handed over; no version counter to bump on a fake tensor."""
    calls = []

    def record(packed, *rest):
        buf, n = packed
        records = [library.Request.from_buffer(buf, 8 * n + library.REQUEST_SIZE * i)
                   for i in range(n)]
        calls.append((records,) + rest)
        return 1

    monkeypatch.setattr(requests, "submit", record)
    monkeypatch.setattr(adapter, "_increment_version", lambda tensors: None)
    monkeypatch.setattr(torch_device, "current_stream", lambda index: 0x5000 + index)
    monkeypatch.setattr(torch_device, "_ready", True)
    monkeypatch.setattr(torch_device, "_consumers", {})
    return calls


def _shape(record):
    return tuple(record.shape[i] for i in range(record.ndim))


def test_cuda_tensor_becomes_a_gpu_request(captured):
    x = FakeCudaTensor(1)
    adapter.submit(ops.ALLREDUCE, [x], "t", mpi_ops.global_process_set, inplace=True)
    reqs, finish, state, drive, consumer = captured[0]
    r, = reqs
    assert (r.device, r.stream, r.input, r.output) == (1, 0x5001, 0xD000, 0xD000)
    assert _shape(r) == (3, 2) and r.dtype == ops.FLOAT32
    assert consumer is torch_device.consumer(1)  # the stream wait at synchronize()

    adapter.submit(ops.ALLGATHER, [FakeCudaTensor(1, dtype=torch.bool)], None,
                   mpi_ops.global_process_set, True)
    reqs, _, state, _, consumer = captured[1]
    assert (reqs[0].device, reqs[0].stream, reqs[0].dtype) == (1, 0x5001, ops.BOOL)
    # Outputs made on cuda:1 at synchronize.
    assert state[1] == [(ops.BOOL, 1)] and consumer is not None


def test_cpu_tensor_adds_nothing(captured):
    x = torch.ones(4)
    adapter.submit(ops.ALLREDUCE, [x], "t", mpi_ops.global_process_set, inplace=True)
    reqs, _, _, _, consumer = captured[0]
    assert (reqs[0].device, reqs[0].stream, consumer) == (ops.CPU_DEVICE, None, None)


def test_packed_requests_keep_devices_apart(captured):
    """One name, settings, dtype and shape on cuda:1, cuda:0 and the CPU: the cache of
    packed requests (adapter._packed_requests) gives each its own, whose record names
    its device; a second call of each reuses it with its own stream."""
    for round in range(2):
        for tensor in (FakeCudaTensor(1), FakeCudaTensor(0), torch.ones(3, 2)):
            adapter.submit(ops.ALLREDUCE, [tensor], "t.packed", mpi_ops.global_process_set,
                           inplace=True)
    records = [call[0][0] for call in captured]
    assert [r.device for r in records] == [1, 0, ops.CPU_DEVICE] * 2
    assert [r.stream for r in records] == [0x5001, 0x5000, None] * 2
    assert [r.name for r in records] == [b"allreduce.t.packed"] * 6
    packed = [p for key, p in adapter._packed_requests.items() if "t.packed" in key]
    assert sorted(p.device for p in packed) == [ops.CPU_DEVICE, 0, 1]


def test_other_devices_are_refused():
    with pytest.raises(NotImplementedError, match="meta"):
        adapter.prepare(torch.empty(2, device="meta"))


def test_synchronize_waits_on_the_consumer_stream(monkeypatch):
    waits = []
    monkeypatch.setattr(requests, "enqueue", lambda packed, drive: ((41, 42), None))
    monkeypatch.setattr(library, "perseus_wait", lambda h, t: 0)
    monkeypatch.setattr(library, "perseus_release", lambda h: 0)
    monkeypatch.setattr(library, "perseus_stream_wait", lambda h, s: waits.append(((h,), s)) or 0)
    monkeypatch.setattr(library, "perseus_stream_wait_all", lambda address, n, s: waits.append(
        (tuple((ctypes.c_int64 * n).from_address(address)), s)) or 0)

    def finish(state, handles):
        waits.append("finish")
        return state

    h = requests.submit([None, None], finish, "gpu", consumer_stream=lambda: 0x77)
    assert requests.synchronize(h) == "gpu"
    # One call for both, before the results are touched.
    assert waits == [((41, 42), 0x77), "finish"]
    waits.clear()
    assert requests.synchronize(requests.submit([None], finish, "cpu")) == "cpu"
    assert waits == ["finish"]  # CPU requests: no stream wait


def test_synchronize_all_waits_once_per_consumer_stream(monkeypatch):
    waits = []
    handles = iter([(61, 62), (63,), (64,)])
    monkeypatch.setattr(requests, "enqueue", lambda packed, drive: (next(handles), None))
    monkeypatch.setattr(library, "perseus_wait_all", lambda address, n, timeout, index: 0)
    monkeypatch.setattr(library, "perseus_release", lambda h: 0)
    monkeypatch.setattr(library, "perseus_stream_wait", lambda h, s: waits.append(((h,), s)) or 0)
    monkeypatch.setattr(library, "perseus_stream_wait_all", lambda address, n, s: waits.append(
        (tuple((ctypes.c_int64 * n).from_address(address)), s)) or 0)
    finish = lambda state, hs: waits.append(state) or state  # noqa: E731
    a = requests.submit([None, None], finish, "a", consumer_stream=lambda: 5)
    b = requests.submit([None], finish, "b", consumer_stream=lambda: 5)
    c = requests.submit([None], finish, "c")  # CPU: no wait
    assert requests.synchronize_all([a, b, c]) == ["a", "b", "c"]
    assert waits == [((61, 62, 63), 5), "a", "b", "c"]


def test_failed_gpu_request_is_still_stream_waited(monkeypatch):
    waits = []
    monkeypatch.setattr(requests, "enqueue", lambda packed, drive: ((51,), None))
    monkeypatch.setattr(library, "perseus_wait", lambda h, t: 2)  # a failure status
    monkeypatch.setattr(library, "perseus_release", lambda h: 0)
    monkeypatch.setattr(library, "perseus_stream_wait", lambda h, s: waits.append((h, s)) or 0)
    h = requests.submit([None], lambda s, hs: None, None, consumer_stream=lambda: 9)
    with pytest.raises(Exception):
        requests.synchronize(h)
    assert waits == [(51, 9)]  # its inputs may still be read on the device


def test_device_bytes_interface():
    view = torch_device.DeviceBytes(0xABC000, 96)
    assert view.__cuda_array_interface__ == {"shape": (96,), "typestr": "|u1",
                                             "data": (0xABC000, False), "strides": None,
                                             "version": 3, "stream": None}


def test_join_device_argument(monkeypatch):
    monkeypatch.setattr(mpi_ops._tops, "join", lambda: 3)
    for device in (-1, 0, 2, torch.device("cpu"), torch.device("cuda", 1), "cuda:0"):
        assert mpi_ops.join(device) == 3
    for bad in (-2, 1.5, True, None):
        with pytest.raises(ValueError, match="join"):
            mpi_ops.join(bad)


def test_ddp_moves_inputs_to_its_device():
    Pair = collections.namedtuple("Pair", "a b")
    x = torch.ones(2, dtype=torch.float64)
    moved = ddp._to_device(({"k": [x, 3]}, Pair(x, "s")), torch.device("cpu"))
    assert isinstance(moved[1], Pair) and moved[1].b == "s" and moved[0]["k"][1] == 3
    assert torch.equal(moved[0]["k"][0], x)
    assert [ddp._device_index(d) for d in (1, "cuda:2", torch.device("cuda", 3))] == [1, 2, 3]
    with pytest.raises(ValueError, match="index"):
        ddp._device_index("cuda")
