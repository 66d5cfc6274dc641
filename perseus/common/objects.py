"""broadcast_object / allgather_object for every front end: pickle + two collectives.

Framework-neutral: the bytes travel as numpy arrays straight through
perseus.common.requests, so the PyTorch and TensorFlow adapters share this code
and neither needs its own tensors for it.
"""

import pickle

import numpy as np

from perseus.common import basics as _basics
from perseus.common import ops as _ops
from perseus.common import requests as _requests
from perseus.common.process_sets import global_process_set

_DTYPES = {np.dtype(np.int64): _ops.INT64, np.dtype(np.uint8): _ops.UINT8}


def default_name(base, process_set):
    """A name fixed per process set, so ranks agree whatever object they pass."""
    set_id = process_set.process_set_id
    return base if set_id in (None, 0) else "%s.set%d" % (base, set_id)


def _set_id(process_set):
    if process_set.process_set_id is None:
        raise ValueError("%r is not registered: call add_process_set() on every rank first"
                         % (process_set,))
    return process_set.process_set_id


def _root_in_set(process_set, root_rank):
    if process_set.process_set_id == _ops.GLOBAL_PROCESS_SET:
        return root_rank
    try:
        return process_set.ranks.index(root_rank)
    except ValueError:
        raise ValueError("root_rank %s is not a member of %r" % (root_rank, process_set)) from None


def _finish_array(state, handles):
    return state[1]


def _broadcast_(array, root_rank, name, process_set):
    """Overwrites the contiguous numpy `array` with root's, in place."""
    spec = (_requests.wire_name(_ops.BROADCAST, name), _ops.BROADCAST, 0, _DTYPES[array.dtype],
            _ops.CPU_DEVICE, array.shape, array.ctypes.data if array.size else 0,
            array.ctypes.data if array.size else 0, 1.0, 1.0,
            _root_in_set(process_set, root_rank), _set_id(process_set), None, 0, 0)
    return _requests.synchronize(_requests.submit([spec], _finish_array, (array, array), True))


def _finish_gathered(state, handles):
    buffer, shape, _ = _requests.output(handles[0], _DTYPES[state.dtype])
    if buffer is None:
        return np.empty(shape, dtype=state.dtype)
    # Copy: the core's buffer is freed once `buffer` goes.
    return np.frombuffer(buffer, dtype=state.dtype).reshape(shape).copy()


def _allgather(array, name, process_set):
    spec = (_requests.wire_name(_ops.ALLGATHER, name), _ops.ALLGATHER, 0, _DTYPES[array.dtype],
            _ops.CPU_DEVICE, array.shape, array.ctypes.data if array.size else 0, 0, 1.0, 1.0,
            0, _set_id(process_set), None, 0, 0)
    return _requests.synchronize(_requests.submit([spec], _finish_gathered, array, True))


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's `obj` (pickled) on every rank; root gets its own obj back."""
    name = name or default_name("broadcast_object", process_set)
    is_root = _basics.rank() == root_rank
    if is_root:
        payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL),
                                dtype=np.uint8).copy()
        length = np.array([payload.size], dtype=np.int64)
    else:
        length = np.zeros(1, dtype=np.int64)
    _broadcast_(length, root_rank, name + ".len", process_set)
    if not is_root:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    _broadcast_(payload, root_rank, name + ".data", process_set)
    return obj if is_root else pickle.loads(payload.tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj` (pickled), in rank order of the set."""
    name = name or default_name("allgather_object", process_set)
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL),
                            dtype=np.uint8).copy()
    lengths = _allgather(np.array([payload.size], dtype=np.int64), name + ".len", process_set)
    blob = _allgather(payload, name + ".data", process_set).tobytes()
    result, start = [], 0
    for length in lengths.tolist():
        result.append(pickle.loads(blob[start:start + length]))
        start += length
    return result
