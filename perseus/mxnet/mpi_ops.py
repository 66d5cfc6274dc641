"""MXNet adapter: Horovod's MXNet collective API over the Perseus core.

This file only converts arrays: NDArray -> request (dtype code, shape) and back;
the request's other fields (set, root, names, splits, rows) follow
perseus.common.builder's rules; batching and errors are perseus.common's.
Semantics follow Horovod's MXNet API: plain ops return a new NDArray, underscore
ops write into the input and return it, grouped ops run their arrays as one unit;
every op takes `priority` (MXNet engine priority, higher runs first).

allreduce, broadcast and reducescatter (and their grouped forms) run inside MXNet's
engine (engine.push): the call returns at once, and the result is ready when MXNet
says so. allgather (grouped too) and alltoall return arrays whose shape depends on
the other ranks, so they wait for their input, run the collective and return
finished arrays.

CPU NDArrays (default storage) only.
"""

import math

import mxnet as mx
import numpy as np

from perseus.common import builder as _builder
from perseus.common import ops as _ops
from perseus.common import requests as _requests
from perseus.common.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (Horovod's names)
from perseus.common.process_sets import global_process_set
from perseus.mxnet import engine as _engine
from perseus.common.ops import resolve_op as _resolve_op
# Horovod's mpi_ops holds the basics too (size, rank, ... and `_basics`): the same
# objects as the package's (shutdown is the engine's, which waits for MXNet first).
from perseus.common.horovod_api import *  # noqa: F401,F403,E402
from perseus.common.horovod_modules import BASICS as _basics  # noqa: F401,E402
from perseus.mxnet.engine import shutdown  # noqa: F401,E402

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
_Request = _builder.Request


def _code(array, op_type, reduce_op=0):
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
    _builder.check_code(op_type, reduce_op, code)
    return code


def _set_id(process_set):
    """The set's id; ValueError here unless this rank is a member: the engine
    enqueues later, where an error would only mark the outputs as failed."""
    _builder.member_rank(process_set)
    return process_set.process_set_id


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
    # Checked here, like the set: the engine enqueues later.
    root = _builder.root_in_set(process_set, root_rank) if op_type == _ops.BROADCAST else 0
    requests, outputs = [], []
    for tensor, wire in zip(tensors, _builder.names(op_type, name, len(tensors), grouped)):
        code = _code(tensor, op_type, reduce_op)
        outputs.append(tensor if inplace else
                       mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype))
        requests.append(_Request(op_type, set_id, code, tuple(tensor.shape), name=wire,
                                 reduce_op=reduce_op, prescale=float(prescale),
                                 postscale=float(postscale), root_rank=root))
    if requests:
        _engine.push(_builder.group(requests, grouped), list(tensors), outputs, priority, op_name,
                     _after(op_type, name))
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
    """allreduce of a list of arrays, negotiated as one unit; returns a list (an empty
    `tensors` as it is, as Horovod)."""
    op = _resolve_op(op, average)
    if not tensors:
        return tensors
    return _same_shape(_ops.ALLREDUCE, _check_group(tensors), False, name, op, prescale_factor,
                       postscale_factor, 0, process_set, priority, True, b"PerseusAllreduce")


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, op=None):
    """grouped_allreduce in place; returns `tensors`, the object given, as Horovod."""
    op = _resolve_op(op, average)
    if not tensors:
        return tensors
    _same_shape(_ops.ALLREDUCE, _check_group(tensors), True, name, op, prescale_factor,
                postscale_factor, 0, process_set, priority, True, b"PerseusAllreduce")
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

def _reducescatter(tensors, op, name, priority, process_set, prescale, postscale, grouped):
    """Reducescatter of each array in MXNet's engine; returns the output arrays."""
    op = _resolve_op(op, None)
    _builder.check_op(_ops.REDUCESCATTER, op)
    set_id = _set_id(process_set)
    requests, outputs = [], []
    for tensor, wire in zip(tensors, _builder.names(_ops.REDUCESCATTER, name, len(tensors),
                                                    grouped)):
        code = _code(tensor, _ops.REDUCESCATTER, op)
        rows = _builder.scatter_rows(tuple(tensor.shape), process_set)  # ValueError, as Horovod
        outputs.append(mx.nd.empty((rows,) + tuple(tensor.shape[1:]), ctx=tensor.context,
                                   dtype=tensor.dtype))
        requests.append(_Request(_ops.REDUCESCATTER, set_id, code, tuple(tensor.shape),
                                 name=wire, reduce_op=op, prescale=float(prescale),
                                 postscale=float(postscale)))
    _engine.push(requests, list(tensors), outputs, priority, b"PerseusReducescatter",
                 _after(_ops.REDUCESCATTER, name))
    return outputs


def reducescatter(tensor, op=Average, name=None, priority=0, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set and returns this rank's block of rows of the
    result (dim 0 split as evenly as possible, the first ranks getting one more)."""
    return _reducescatter((tensor,), op, name, priority, process_set, prescale_factor,
                          postscale_factor, False)[0]


def grouped_reducescatter(tensors, op=Average, name=None, priority=0,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of a list of arrays, negotiated as one unit; returns a list."""
    return _reducescatter(_check_group(tensors), op, name, priority, process_set,
                          prescale_factor, postscale_factor, True)


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


def _allgather(tensors, name, process_set, grouped):
    """Allgather of each finished array as one unit; returns the list of results."""
    hosts, codes = [], []
    for tensor in tensors:
        host, code = _host(tensor, _ops.ALLGATHER)
        _builder.check_rows(_ops.ALLGATHER, process_set, host.shape)
        hosts.append(host)
        codes.append(code)
    set_id = _set_id(process_set)
    requests = [_Request(_ops.ALLGATHER, set_id, code, host.shape,
                         host.ctypes.data if host.size else 0, name=wire)
                for host, code, wire in zip(hosts, codes, _builder.names(
                    _ops.ALLGATHER, name, len(tensors), grouped))]

    def finish(state, handles):
        return [_to_ndarray(h, code, t)[0] for h, code, t in zip(handles, codes, tensors)]
    return _requests.synchronize(_requests.submit(_builder.pack(requests), finish, hosts, True))


def allgather(tensor, name=None, priority=0, process_set=global_process_set):
    """Concatenates every rank's `tensor` along dim 0 (other dims must agree).
    Waits for `tensor`; the result is a finished NDArray."""
    return _allgather((tensor,), name, process_set, False)[0]


def grouped_allgather(tensors, name=None, priority=0, process_set=global_process_set):
    """allgather of a list of arrays, negotiated as one unit; returns a list of
    finished NDArrays."""
    return _allgather(_check_group(tensors), name, process_set, True)


def alltoall(tensor, splits=None, name=None, priority=0, process_set=global_process_set):
    """Sends splits[i] rows of `tensor` (dim 0, in order) to rank i of the set and
    returns the concatenation of what every rank sent here. splits=None splits dim 0
    evenly and returns that array alone; with splits, returns (array, received
    splits as an int32 NDArray), as Horovod. Waits for `tensor`; the results are
    finished NDArrays."""
    host, code = _host(tensor, _ops.ALLTOALL)
    given = splits is not None
    if isinstance(splits, mx.nd.NDArray):
        splits = splits.asnumpy().reshape(-1)
    request = _Request(_ops.ALLTOALL, _set_id(process_set), code, host.shape,
                       host.ctypes.data if host.size else 0,
                       name=_builder.names(_ops.ALLTOALL, name)[0],
                       splits=_builder.alltoall_splits(splits, process_set, host.shape))

    def finish(state, handles):
        output, received = _to_ndarray(handles[0], code, tensor)
        if not given:
            return output
        return output, mx.nd.array(np.asarray(received, dtype=np.int32), dtype=np.int32)
    return _requests.synchronize(_requests.submit(_builder.pack([request]), finish, host, True))
