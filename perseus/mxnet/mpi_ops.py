"""MXNet adapter: Horovod's MXNet collective API over the Perseus core.

This file only converts arrays: NDArray -> request (dtype code, shape) and back;
names, batching and errors are perseus.common's. Semantics follow Horovod's MXNet
API: plain ops return a new NDArray, underscore ops write into the input and
return it, grouped ops run their arrays as one unit; every op takes `priority`
(MXNet engine priority, higher runs first).

allreduce, broadcast and reducescatter run inside MXNet's engine (engine.push): the
call returns at once, and the result is ready when MXNet says so. allgather and
alltoall return arrays whose shape depends on the other ranks, so they wait for
their input, run the collective and return a finished array.

CPU NDArrays (default storage) only.
"""

import math

import mxnet as mx
import numpy as np

from perseus.common import objects as _objects
from perseus.common import ops as _ops
from perseus.common import requests as _requests
from perseus.common.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (Horovod's names)
from perseus.common.process_sets import global_process_set
from perseus.mxnet import engine as _engine
from perseus.common.ops import resolve_op as _resolve_op

# The one numpy/MXNet dtype <-> core dtype table.
_DTYPE_CODES = {
    np.dtype(np.uint8): _ops.UINT8,
    np.dtype(np.int8): _ops.INT8,
    np.dtype(np.int32): _ops.INT32,
    np.dtype(np.int64): _ops.INT64,
    np.dtype(np.float16): _ops.FLOAT16,
    np.dtype(np.float32): _ops.FLOAT32,
    np.dtype(np.float64): _ops.FLOAT64,
    np.dtype(np.bool_): _ops.BOOL,
}
_CPU = _ops.CPU_DEVICE


def _code(array, op_type):
    if not isinstance(array, mx.nd.NDArray):
        raise TypeError("Perseus MXNet ops take mxnet NDArrays, got %s" % type(array).__name__)
    if array.context.device_type != "cpu":
        raise NotImplementedError("Perseus MXNet ops support CPU arrays only, got one on %s"
                                  % array.context)
    if array.stype != "default":
        raise NotImplementedError("Perseus MXNet ops support dense arrays only, got stype %r"
                                  % array.stype)
    code = _DTYPE_CODES.get(np.dtype(array.dtype))
    if code is None:
        raise ValueError("Perseus does not support arrays of dtype %s (supported: %s)"
                         % (np.dtype(array.dtype).name,
                            ", ".join(d.name for d in _DTYPE_CODES)))
    if code == _ops.BOOL and op_type in (_ops.ALLREDUCE, _ops.REDUCESCATTER):
        raise ValueError("%s does not support bool arrays" % _ops.OP_TYPE_NAMES[op_type])
    return code


def _set_id(process_set):
    if process_set.process_set_id is None:
        raise ValueError("%r is not registered: call hvd.add_process_set() on every rank first"
                         % (process_set,))
    if process_set.process_set_id != _ops.GLOBAL_PROCESS_SET and process_set.rank() == -1:
        raise ValueError("this rank is not a member of %r" % (process_set,))
    return process_set.process_set_id


def _names(op_type, name, count, grouped):
    """Wire names per array: None (numbered by the core's rules) or "<op>.<name>",
    a group's arrays "<op>.<name>.<i>"."""
    if name is None:
        return (None,) * count
    if grouped:
        return [_requests.wire_name(op_type, "%s.%d" % (name, i)) for i in range(count)]
    return (_requests.wire_name(op_type, name),)


def _spec(wire, op_type, reduce_op, code, shape, prescale, postscale, root, set_id):
    return (wire, op_type, reduce_op, code, _CPU, tuple(shape), 0, 0, float(prescale),
            float(postscale), root, set_id, None, 0, 0)


# (op type, user name) -> a one-element NDArray that every request of that name
# lists as written: MXNet then runs same-named requests one after the other, so a
# name is never twice in flight in the core (which refuses that), whatever order
# the engine picks. Unnamed requests get fresh numbered names and need none.
_tokens = {}


def _after(op_type, name):
    if name is None:
        return None
    token = _tokens.get((op_type, name))
    if token is None:
        token = _tokens[(op_type, name)] = mx.nd.zeros((1,))
    return token


def _same_shape(op_type, tensors, inplace, name, reduce_op, prescale, postscale, root_rank,
                process_set, priority, grouped, op_name):
    """Allreduce / broadcast in MXNet's engine; returns the output arrays."""
    set_id = _set_id(process_set)
    root = 0
    if op_type == _ops.BROADCAST:
        # Checked here: the engine enqueues later, where an error would only mark
        # the outputs as failed.
        root = _objects._root_in_set(process_set, root_rank)
        if not 0 <= root < process_set.size():
            raise ValueError("root_rank %s is out of range for a process set of %d ranks"
                             % (root_rank, process_set.size()))
    specs, outputs = [], []
    for tensor, wire in zip(tensors, _names(op_type, name, len(tensors), grouped)):
        code = _code(tensor, op_type)
        if op_type == _ops.ALLREDUCE and reduce_op == Adasum:
            _ops.check_adasum(op_type, _ops.DTYPE_NAMES[code])
        outputs.append(tensor if inplace else
                       mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype))
        specs.append(_spec(wire, op_type, reduce_op, code, tensor.shape, prescale, postscale,
                           root, set_id))
    if specs:
        _engine.push(specs, list(tensors), outputs, priority, op_name, _after(op_type, name))
    return outputs


def _check_group(tensors):
    if not isinstance(tensors, list):
        tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped ops need at least one array")
    return tensors


# ---- allreduce ------------------------------------------------------------------

def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set, op=None):
    """Reduces `tensor` over the process set (op: Average by default, Sum, Min, Max,
    Product, Adasum) into a new NDArray."""
    op = _resolve_op(op, average)
    return _same_shape(_ops.ALLREDUCE, (tensor,), False, name, op, prescale_factor,
                       postscale_factor, 0, process_set, priority, False, b"PerseusAllreduce")[0]


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, op=None):
    """allreduce in place: `tensor` receives the result and is returned."""
    op = _resolve_op(op, average)
    return _same_shape(_ops.ALLREDUCE, (tensor,), True, name, op, prescale_factor,
                       postscale_factor, 0, process_set, priority, False, b"PerseusAllreduce")[0]


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, op=None):
    """allreduce of a list of arrays, negotiated as one unit; returns a list."""
    op = _resolve_op(op, average)
    return _same_shape(_ops.ALLREDUCE, _check_group(tensors), False, name, op, prescale_factor,
                       postscale_factor, 0, process_set, priority, True, b"PerseusAllreduce")


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, op=None):
    """grouped_allreduce in place; returns the input list."""
    op = _resolve_op(op, average)
    tensors = _check_group(tensors)
    _same_shape(_ops.ALLREDUCE, tensors, True, name, op, prescale_factor, postscale_factor, 0,
                process_set, priority, True, b"PerseusAllreduce")
    return tensors


# ---- broadcast ------------------------------------------------------------------

def broadcast(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """root_rank's `tensor` on every rank, as a new NDArray."""
    return _same_shape(_ops.BROADCAST, (tensor,), False, name, 0, 1.0, 1.0, root_rank,
                       process_set, priority, False, b"PerseusBroadcast")[0]


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """broadcast in place: `tensor` receives root_rank's values and is returned."""
    return _same_shape(_ops.BROADCAST, (tensor,), True, name, 0, 1.0, 1.0, root_rank,
                       process_set, priority, False, b"PerseusBroadcast")[0]


# ---- reducescatter --------------------------------------------------------------

def reducescatter(tensor, op=Average, name=None, priority=0, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set and returns this rank's block of rows of the
    result (dim 0 split as evenly as possible, the first ranks getting one more)."""
    op = _resolve_op(op, None)
    if op == Adasum:
        _ops.check_adasum(_ops.REDUCESCATTER)
    code = _code(tensor, _ops.REDUCESCATTER)
    if tensor.ndim == 0:
        raise ValueError("reducescatter needs an array with at least one dimension")
    set_size, set_rank = process_set.size(), process_set.rank()
    rows, extra = divmod(tensor.shape[0], set_size)
    output = mx.nd.empty((rows + (set_rank < extra),) + tuple(tensor.shape[1:]),
                         ctx=tensor.context, dtype=tensor.dtype)
    wire = _names(_ops.REDUCESCATTER, name, 1, False)[0]
    spec = _spec(wire, _ops.REDUCESCATTER, op, code, tensor.shape, prescale_factor,
                 postscale_factor, 0, _set_id(process_set))
    _engine.push([spec], [tensor], [output], priority, b"PerseusReducescatter",
                 _after(_ops.REDUCESCATTER, name))
    return output


# ---- allgather / alltoall: output shape known only afterwards -------------------

def _host(tensor, op_type):
    """(contiguous numpy copy of a finished `tensor`, dtype code)."""
    code = _code(tensor, op_type)
    return np.ascontiguousarray(tensor.asnumpy()), code


def _to_ndarray(handle, code, like):
    buffer, shape, recv = _requests.output(handle, code)
    dtype = np.dtype(like.dtype)
    if buffer is None or math.prod(shape) == 0:
        data = np.empty(shape, dtype=dtype)
    else:
        data = np.frombuffer(buffer, dtype=dtype, count=math.prod(shape)).reshape(shape)
    return mx.nd.array(data, ctx=like.context, dtype=dtype), recv


def allgather(tensor, name=None, priority=0, process_set=global_process_set):
    """Concatenates every rank's `tensor` along dim 0 (other dims must agree).
    Waits for `tensor`; the result is a finished NDArray."""
    host, code = _host(tensor, _ops.ALLGATHER)
    if host.ndim == 0:
        raise ValueError("allgather needs an array with at least one dimension")
    wire = _names(_ops.ALLGATHER, name, 1, False)[0]
    spec = (wire, _ops.ALLGATHER, 0, code, _CPU, host.shape, host.ctypes.data if host.size else 0,
            0, 1.0, 1.0, 0, _set_id(process_set), None, 0, 0)
    finish = lambda state, handles: _to_ndarray(handles[0], code, tensor)[0]  # noqa: E731
    return _requests.synchronize(_requests.submit([spec], finish, host, True))


def alltoall(tensor, splits=None, name=None, priority=0, process_set=global_process_set):
    """Sends splits[i] rows of `tensor` (dim 0, in order) to rank i of the set and
    returns the concatenation of what every rank sent here. splits=None splits dim 0
    evenly. Waits for `tensor`; the result is a finished NDArray."""
    host, code = _host(tensor, _ops.ALLTOALL)
    if host.ndim == 0:
        raise ValueError("alltoall needs an array with at least one dimension")
    if splits is not None:
        if isinstance(splits, mx.nd.NDArray):
            splits = splits.asnumpy()
        splits = tuple(int(s) for s in np.asarray(splits).reshape(-1))
        if len(splits) != process_set.size():
            raise ValueError("alltoall splits has %d entries; it needs one per rank of the "
                             "process set (%d)" % (len(splits), process_set.size()))
        if min(splits) < 0 or sum(splits) != host.shape[0]:
            raise ValueError("alltoall splits must be non-negative and sum to the first "
                             "dimension %d, got %s" % (host.shape[0], splits))
    wire = _names(_ops.ALLTOALL, name, 1, False)[0]
    spec = (wire, _ops.ALLTOALL, 0, code, _CPU, host.shape, host.ctypes.data if host.size else 0,
            0, 1.0, 1.0, 0, _set_id(process_set), splits, 0, 0)
    finish = lambda state, handles: _to_ndarray(handles[0], code, tensor)[0]  # noqa: E731
    return _requests.synchronize(_requests.submit([spec], finish, host, True))
