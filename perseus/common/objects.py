"""broadcast_object / allgather_object for every front end: pickle + two collectives;
gather_object / scatter_object: pickle + one alltoall.

Objects are pickled with cloudpickle, as Horovod's, so lambdas, closures and classes
defined in a script travel too (plain pickle refuses them by reference); where it is
missing (it is a dependency: a bare image such as the GPU machine's), with pickle.

Framework-neutral: the bytes travel as numpy arrays straight through
perseus.common.requests, so the PyTorch and TensorFlow adapters share this code
and neither needs its own tensors for it.
"""

import pickle

import numpy as np

try:
    import cloudpickle as _pickler
except ImportError:
    _pickler = pickle

from perseus.common import builder as _builder
from perseus.common import ops as _ops
from perseus.common import requests as _requests
from perseus.common.process_sets import global_process_set

_DTYPES = {np.dtype(np.int64): _ops.INT64, np.dtype(np.uint8): _ops.UINT8}


def _finish_array(state, handles):
    return state[1]


def _broadcast_(array, root_rank, name, process_set):
    """Overwrites the contiguous numpy `array` with root's, in place."""
    address = array.ctypes.data if array.size else 0
    request = _builder.Request(_ops.BROADCAST, _builder.set_id(process_set), _DTYPES[array.dtype],
                               array.shape, address, address,
                               name=_builder.wire_name(_ops.BROADCAST, name),
                               root_rank=_builder.root_in_set(process_set, root_rank))
    return _requests.synchronize(_requests.submit(_builder.pack([request]), _finish_array,
                                                  (array, array), True))


def _finish_gathered(state, handles):
    buffer, shape, _ = _requests.output(handles[0], _DTYPES[state.dtype])
    if buffer is None:
        return np.empty(shape, dtype=state.dtype)
    # Copy: the core's buffer is freed once `buffer` goes.
    return np.frombuffer(buffer, dtype=state.dtype).reshape(shape).copy()


def _allgather(array, name, process_set, bound=None):
    request = _builder.Request(_ops.ALLGATHER, _builder.set_id(process_set), _DTYPES[array.dtype],
                               array.shape, array.ctypes.data if array.size else 0,
                               name=_builder.wire_name(_ops.ALLGATHER, name))
    return _requests.settled(_requests.submit(_builder.pack([request]), _finish_gathered,
                                              array, True), bound)


def _finish_exchanged(state, handles):
    buffer, shape, sent_here = _requests.output(handles[0], _ops.UINT8)
    data = b"" if buffer is None else bytes(buffer)  # a copy: the core's buffer is freed
    return data, sent_here


def _alltoall(payload, splits, name, process_set):
    """Sends splits[i] bytes of the uint8 array `payload` (in order) to set rank i;
    returns (the bytes that arrived, how many came from each set rank)."""
    request = _builder.Request(_ops.ALLTOALL, _builder.set_id(process_set), _ops.UINT8,
                               payload.shape, payload.ctypes.data if payload.size else 0,
                               name=_builder.wire_name(_ops.ALLTOALL, name),
                               splits=_builder.alltoall_splits(splits, process_set,
                                                               payload.shape))
    return _requests.synchronize(_requests.submit(_builder.pack([request]),
                                                  _finish_exchanged, payload, True))


def pickled(obj):
    return _pickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def unpickled(data, lengths):
    """The objects pickled back to back in the bytes `data`, `lengths` bytes each."""
    result, start = [], 0
    for length in lengths:
        result.append(pickle.loads(data[start:start + length]))
        start += length
    return result


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's `obj` (pickled) on every rank; root gets its own obj back."""
    name = name or _builder.default_name("broadcast_object", process_set)
    is_root = global_process_set.rank() == root_rank  # the global set's rank is the rank
    if is_root:
        payload = np.frombuffer(pickled(obj), dtype=np.uint8).copy()
        length = np.array([payload.size], dtype=np.int64)
    else:
        length = np.zeros(1, dtype=np.int64)
    _broadcast_(length, root_rank, name + ".len", process_set)
    if not is_root:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    _broadcast_(payload, root_rank, name + ".data", process_set)
    return obj if is_root else pickle.loads(payload.tobytes())


def allgather_object(obj, name=None, process_set=global_process_set, bound=None):
    """Returns the list of every rank's `obj` (pickled), in rank order of the set.
    bound: None, or (deadline, reason) as requests.run() takes it: a rank of the set
    that has not called it by then fails the call on the others, named in the error."""
    name = name or _builder.default_name("allgather_object", process_set)
    payload = np.frombuffer(pickled(obj), dtype=np.uint8).copy()
    lengths = _allgather(np.array([payload.size], dtype=np.int64), name + ".len", process_set,
                         bound)
    blob = _allgather(payload, name + ".data", process_set).tobytes()
    return unpickled(blob, lengths.tolist())


def gather_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """On root_rank (a global rank), the list of every rank's `obj` (pickled), in rank
    order of the set; None elsewhere. One alltoall: each rank sends only to the root."""
    name = name or _builder.default_name("gather_object", process_set)
    root = _builder.root_in_set(process_set, root_rank)
    payload = np.frombuffer(pickled(obj), dtype=np.uint8)
    splits = [payload.size if r == root else 0 for r in range(process_set.size())]
    data, lengths = _alltoall(payload, splits, name, process_set)
    return unpickled(data, lengths) if global_process_set.rank() == root_rank else None


def scatter_object(objects, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's objects[i] (pickled) on set rank i; the root passes one object per rank
    of the set, the others None. One alltoall: only the root sends."""
    name = name or _builder.default_name("scatter_object", process_set)
    root = _builder.root_in_set(process_set, root_rank)
    if global_process_set.rank() == root_rank:
        pieces = [pickled(obj) for obj in objects]
        payload = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        splits = [len(piece) for piece in pieces]
    else:
        payload, splits = np.empty(0, dtype=np.uint8), [0] * process_set.size()
    data, lengths = _alltoall(payload, splits, name, process_set)
    return pickle.loads(data[:lengths[root]])
