"""PyTorch adapter: Horovod's collective API over the Perseus core.

This file only converts tensors: torch tensor -> request (pointer, dtype code,
shape) and core result -> torch tensor. Names, handles, batching and errors are
perseus.common's. Semantics follow Horovod: non-underscore ops return a new tensor
and leave the input alone; underscore ops work in place and return the same
tensor; *_async ops return an int handle for poll()/synchronize(); grouped ops
enqueue all their tensors as one unit and synchronize() to a list.

CPU tensors only for now. Non-contiguous inputs are copied to contiguous memory
(and, for in-place ops, copied back on completion).
"""

import math

import torch

from perseus.common import ops as _ops
from perseus.common.ops import Adasum, Average, Max, Min, Product, Sum  # Horovod's reduce-op names
from perseus.common import requests as _requests
from perseus.common.exceptions import HorovodInternalError
from perseus.common.process_sets import global_process_set
from perseus.torch.compression import Compression

# Autograd wrappers; they import this module back (resolved at call time).
from perseus.torch import autograd_ops as _autograd
from perseus.common.ops import resolve_op as _resolve_op


# The one torch dtype <-> core dtype table.
_DTYPE_CODES = {
    torch.uint8: _ops.UINT8,
    torch.int8: _ops.INT8,
    torch.int16: _ops.INT16,
    torch.int32: _ops.INT32,
    torch.int64: _ops.INT64,
    torch.float16: _ops.FLOAT16,
    torch.bfloat16: _ops.BFLOAT16,
    torch.float32: _ops.FLOAT32,
    torch.float64: _ops.FLOAT64,
    torch.bool: _ops.BOOL,
}
_TORCH_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}

_CPU = _ops.CPU_DEVICE
_BOOL = _ops.BOOL
_ALLREDUCE = _ops.ALLREDUCE
_ALLGATHER = _ops.ALLGATHER
_BROADCAST = _ops.BROADCAST
_ALLTOALL = _ops.ALLTOALL
_REDUCESCATTER = _ops.REDUCESCATTER
_NO_COMPRESSION = Compression.none
_wire_name = _requests.wire_name
_submit = _requests.submit
_grad_enabled = torch.is_grad_enabled

poll = _requests.poll
synchronize = _requests.synchronize


# ---- tensor -> request ----------------------------------------------------------

def _prepare(tensor):
    """(contiguous CPU tensor with the input's data, core dtype code)."""
    if not tensor.is_cpu:
        if tensor.is_cuda:
            raise NotImplementedError("CUDA tensors are not supported yet")
        raise NotImplementedError("tensors on device %s are not supported" % tensor.device)
    code = _DTYPE_CODES.get(tensor.dtype)
    if code is None:
        raise ValueError("Perseus does not support tensors of dtype %s (supported: %s)"
                         % (tensor.dtype, ", ".join(str(d) for d in _DTYPE_CODES)))
    if tensor.is_contiguous():
        return tensor, code
    if tensor.layout is not torch.strided:
        raise NotImplementedError("%s tensors are not supported" % tensor.layout)
    return tensor.contiguous(), code


def _set_id(process_set):
    set_id = process_set.process_set_id
    if set_id is None:
        raise ValueError("%r is not registered: call hvd.add_process_set() on every rank first"
                         % (process_set,))
    return set_id


def _wire_names(op_type, name, count, grouped):
    """Per tensor: the wire name of a named request (a group's tensors are
    "<name>.<i>"), or None, which requests.enqueue() replaces with a numbered name."""
    if name is None:
        return (None,) * count
    if grouped:
        return [_wire_name(op_type, "%s.%d" % (name, i)) for i in range(count)]
    return (_wire_name(op_type, name),)


def _requires_grad(tensors):
    if not _grad_enabled():
        return False
    for tensor in tensors:
        if tensor.requires_grad:
            return True
    return False


# ---- result -> tensor -----------------------------------------------------------

def _finish_outputs(state, handles):
    """Outputs we allocated (or the inputs, in place); copies back non-contiguous
    in-place inputs."""
    _, results, copy_back, grouped = state
    for target, source in copy_back:
        target.copy_(source)
    return results if grouped else results[0]


def _tensor_from_core(handle, code):
    """The core-allocated output of `handle` as a tensor viewing its memory.

    Also returns the received splits (alltoall) or None.
    """
    buffer, shape, recv = _requests.output(handle, code)
    dtype = _TORCH_DTYPES[code]
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype), recv
    if buffer is None:
        raise HorovodInternalError("the core returned no buffer for an output of shape %s"
                                   % (shape,))
    return torch.frombuffer(buffer, dtype=dtype, count=numel).view(shape), recv


def _finish_gathered(state, handles):
    _, codes, grouped = state
    results = [_tensor_from_core(h, code)[0] for h, code in zip(handles, codes)]
    return results if grouped else results[0]


def _finish_alltoall(state, handles):
    _, codes = state
    output, recv = _tensor_from_core(handles[0], codes[0])
    return output, torch.tensor(recv or (), dtype=torch.int32)


def _finish_nothing(state, handles):
    return None


# ---- submission -----------------------------------------------------------------

def _same_shape_async(op_type, tensors, inplace, name, reduce_op, prescale, postscale,
                      process_set, root_rank, grouped, drive=False):
    """Allreduce and broadcast: output has the input's shape; we allocate it."""
    set_id = _set_id(process_set)
    specs = []
    sources = []
    results = []
    copy_back = []
    names = _wire_names(op_type, name, len(tensors), grouped)
    for tensor, wire in zip(tensors, names):
        source, code = _prepare(tensor)
        if code == _BOOL and op_type == _ALLREDUCE:
            raise ValueError("allreduce does not support bool tensors")
        if reduce_op == Adasum and op_type == _ALLREDUCE:
            _ops.check_adasum(op_type, _ops.DTYPE_NAMES[code])
        if inplace:
            output = source
            results.append(tensor)
            if source is not tensor:
                # Checked before anything is sent: writing the result back into an
                # expanded view would fail only after every rank ran the collective.
                if any(st == 0 and n > 1 for n, st in zip(tensor.shape, tensor.stride())):
                    raise ValueError("in-place %s of a tensor whose elements share memory "
                                     "(e.g. from expand()); clone() it first"
                                     % ("allreduce" if op_type == _ALLREDUCE else "broadcast"))
                copy_back.append((tensor, source))
        elif source is not tensor:
            output = source  # already a private copy: reduce into it
            results.append(source)
        else:
            output = torch.empty_like(source)  # source is contiguous, so is this
            results.append(output)
        specs.append((wire, op_type, reduce_op, code, _CPU, source.shape, source.data_ptr(),
                      output.data_ptr(), prescale, postscale, root_rank, set_id, None,
                      0, 0))
        sources.append(source)
    return _submit(specs, _finish_outputs, (sources, results, copy_back, grouped), drive)


def _allreduce_async(tensors, inplace, name, op, prescale, postscale, process_set, grouped,
                     drive=False):
    return _same_shape_async(_ALLREDUCE, tensors, inplace, name, op, prescale, postscale,
                             process_set, 0, grouped, drive)


def _set_root(process_set, root_rank):
    """The broadcast root as the core wants it: the rank within the process set.
    Callers name it by global rank, as in Horovod."""
    if _set_id(process_set) == _ops.GLOBAL_PROCESS_SET:
        return root_rank
    try:
        return process_set.ranks.index(root_rank)
    except ValueError:
        raise ValueError("broadcast root_rank %s is not a member of %r"
                         % (root_rank, process_set)) from None


def _broadcast_async(tensors, inplace, root_rank, name, process_set, drive=False, grouped=False):
    return _same_shape_async(_BROADCAST, tensors, inplace, name, 0, 1.0, 1.0, process_set,
                             _set_root(process_set, root_rank), grouped, drive)


def _allgather_async(tensors, name, process_set, grouped, drive=False):
    """The core sizes and allocates the output; synchronize wraps it zero-copy."""
    set_id = _set_id(process_set)
    specs = []
    sources = []
    codes = []
    names = _wire_names(_ALLGATHER, name, len(tensors), grouped)
    for tensor, wire in zip(tensors, names):
        source, code = _prepare(tensor)
        specs.append((wire, _ALLGATHER, 0, code, _CPU, source.shape, source.data_ptr(), 0,
                      1.0, 1.0, 0, set_id, None, 0, 0))
        sources.append(source)
        codes.append(code)
    return _submit(specs, _finish_gathered, (sources, codes, grouped), drive)


def _alltoall_async(tensor, splits, name, process_set, drive=False):
    set_id = _set_id(process_set)
    source, code = _prepare(tensor)
    if source.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    if splits is not None:
        splits = tuple(int(s) for s in (splits.tolist() if hasattr(splits, "tolist") else splits))
        set_size = process_set.size()
        if len(splits) != set_size:
            raise ValueError("alltoall splits has %d entries; it needs one per rank of the "
                             "process set (%d)" % (len(splits), set_size))
        if min(splits) < 0:
            raise ValueError("alltoall splits must be non-negative, got %s" % (splits,))
        if sum(splits) != source.shape[0]:
            raise ValueError("alltoall splits sum to %d but the tensor's first dimension is %d"
                             % (sum(splits), source.shape[0]))
    wire = None if name is None else _wire_name(_ALLTOALL, name)
    spec = (wire, _ALLTOALL, 0, code, _CPU, source.shape, source.data_ptr(), 0, 1.0, 1.0, 0,
            set_id, splits, 0, 0)
    return _submit([spec], _finish_alltoall, (source, (code,)), drive)


def _reducescatter_async(tensors, name, op, prescale, postscale, process_set, grouped, drive=False):
    """Output: this rank's share of dim 0; the first (dim0 % size) ranks of the set
    get one extra row. Computed here, so we allocate the output."""
    if op == Adasum:
        _ops.check_adasum(_REDUCESCATTER)
    set_id = _set_id(process_set)
    set_size = process_set.size()
    set_rank = process_set.rank()
    if set_rank < 0:
        raise ValueError("this process is not a member of %r" % (process_set,))
    specs = []
    sources = []
    results = []
    names = _wire_names(_REDUCESCATTER, name, len(tensors), grouped)
    for tensor, wire in zip(tensors, names):
        source, code = _prepare(tensor)
        if code == _BOOL:
            raise ValueError("reducescatter does not support bool tensors")
        if source.dim() == 0:
            raise ValueError("reducescatter needs a tensor with at least one dimension")
        rows, extra = divmod(source.shape[0], set_size)
        output = torch.empty((rows + (set_rank < extra),) + source.shape[1:], dtype=source.dtype)
        specs.append((wire, _REDUCESCATTER, op, code, _CPU, source.shape, source.data_ptr(),
                      output.data_ptr(), prescale, postscale, 0, set_id, None, 0, 0))
        sources.append(source)
        results.append(output)
    return _submit(specs, _finish_outputs, (sources, results, (), grouped), drive)


def _nonempty(tensors, what):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("%s needs at least one tensor" % what)
    return tensors


# ---- allreduce ------------------------------------------------------------------

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over the process set into a new tensor; returns a
    handle for poll()/synchronize(). The input is not modified."""
    op = _resolve_op(op, average)
    return _allreduce_async((tensor,), False, name, op, prescale_factor, postscale_factor,
                            process_set, False)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` in place; returns a handle."""
    op = _resolve_op(op, average)
    return _allreduce_async((tensor,), True, name, op, prescale_factor, postscale_factor,
                            process_set, False)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` over the process set (default op: Average) and returns the
    result as a new tensor; the input is not modified. Differentiable."""
    op = _resolve_op(op, average)
    if compression is not _NO_COMPRESSION and compression is not None:
        compressed, ctx = compression.compress(tensor)
        reduced = allreduce(compressed, None, name, _NO_COMPRESSION, op, prescale_factor,
                            postscale_factor, process_set)
        return compression.decompress(reduced, ctx)
    if tensor.requires_grad and _grad_enabled():
        return _autograd.Allreduce.apply(tensor, name, op, prescale_factor, postscale_factor,
                                         process_set)
    return synchronize(_allreduce_async((tensor,), False, name, op, prescale_factor,
                                        postscale_factor, process_set, False, drive=True))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` in place and returns it."""
    op = _resolve_op(op, average)
    return synchronize(_allreduce_async((tensor,), True, name, op, prescale_factor,
                                        postscale_factor, process_set, False, drive=True))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing a list of tensors as one unit; synchronize() returns a list
    of new tensors."""
    op = _resolve_op(op, average)
    return _allreduce_async(_nonempty(tensors, "grouped_allreduce"), False, name, op,
                            prescale_factor, postscale_factor, process_set, True)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing a list of tensors in place as one unit; returns a handle."""
    op = _resolve_op(op, average)
    return _allreduce_async(_nonempty(tensors, "grouped_allreduce_"), True, name, op,
                            prescale_factor, postscale_factor, process_set, True)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces a list of tensors as one unit; returns a list of new tensors.
    Differentiable."""
    op = _resolve_op(op, average)
    tensors = _nonempty(tensors, "grouped_allreduce")
    if compression is not _NO_COMPRESSION and compression is not None:
        compressed = [compression.compress(t) for t in tensors]
        reduced = grouped_allreduce([w for w, _ in compressed], None, name, _NO_COMPRESSION, op,
                                    prescale_factor, postscale_factor, process_set)
        return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]
    if _requires_grad(tensors):
        return list(_autograd.GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor,
                                                     process_set, *tensors))
    return synchronize(_allreduce_async(tensors, False, name, op, prescale_factor,
                                        postscale_factor, process_set, True, drive=True))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """Reduces a list of tensors in place as one unit; returns the list."""
    op = _resolve_op(op, average)
    return synchronize(_allreduce_async(_nonempty(tensors, "grouped_allreduce_"), True, name, op,
                                        prescale_factor, postscale_factor, process_set, True,
                                        drive=True))


# ---- allgather ------------------------------------------------------------------

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating `tensor` from every rank along dim 0 (ranks may differ
    in dim 0 only); returns a handle."""
    return _allgather_async((tensor,), name, process_set, False)


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates `tensor` from every rank of the set along dim 0. Differentiable."""
    if tensor.requires_grad and _grad_enabled():
        return _autograd.Allgather.apply(tensor, name, process_set)
    return synchronize(_allgather_async((tensor,), name, process_set, False, drive=True))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts allgathering a list of tensors as one unit; returns a handle."""
    return _allgather_async(_nonempty(tensors, "grouped_allgather"), name, process_set, True)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors as one unit; returns a list. Differentiable."""
    tensors = _nonempty(tensors, "grouped_allgather")
    if _requires_grad(tensors):
        return list(_autograd.GroupedAllgather.apply(name, process_set, *tensors))
    return synchronize(_allgather_async(tensors, name, process_set, True, drive=True))


# ---- broadcast ------------------------------------------------------------------

def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting root_rank's `tensor` into a new tensor; returns a handle.
    root_rank is a global rank (as in Horovod), a member of the process set."""
    return _broadcast_async((tensor,), False, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting root_rank's `tensor` in place; returns a handle."""
    return _broadcast_async((tensor,), True, root_rank, name, process_set)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` as a new tensor on every rank. Differentiable."""
    if tensor.requires_grad and _grad_enabled():
        return _autograd.Broadcast.apply(tensor, root_rank, name, process_set)
    return synchronize(_broadcast_async((tensor,), False, root_rank, name, process_set,
                                        drive=True))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's value; returns it."""
    return synchronize(_broadcast_async((tensor,), True, root_rank, name, process_set,
                                        drive=True))


def grouped_broadcast_async_(tensors, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting a list of tensors in place as one unit (one request batch,
    fused by the core); returns a handle. A Perseus extension (Horovod has none): DDP
    syncs a module's buffers with it before every forward."""
    return _broadcast_async(_nonempty(tensors, "grouped_broadcast_"), True, root_rank, name,
                            process_set, grouped=True)


def grouped_broadcast_(tensors, root_rank, name=None, process_set=global_process_set):
    """Overwrites every tensor of the list with root_rank's, as one unit; returns the list."""
    return synchronize(_broadcast_async(_nonempty(tensors, "grouped_broadcast_"), True, root_rank,
                                        name, process_set, drive=True, grouped=True))


# ---- alltoall -------------------------------------------------------------------

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall; synchronize() returns (output, received_splits)."""
    return _alltoall_async(tensor, splits, name, process_set)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[i] rows of `tensor` (dim 0, in order) to rank i of the set and
    concatenates what every rank sent here. splits=None splits dim 0 evenly.

    Returns (output, received_splits), received_splits an int32 tensor of the rows
    received from each rank. Differentiable.
    """
    if tensor.requires_grad and _grad_enabled():
        return _autograd.Alltoall.apply(tensor, splits, name, process_set)
    return synchronize(_alltoall_async(tensor, splits, name, process_set, drive=True))


# ---- reducescatter --------------------------------------------------------------

def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter; returns a handle."""
    op = _resolve_op(op, None)
    return _reducescatter_async((tensor,), name, op, prescale_factor, postscale_factor,
                                process_set, False)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set and returns this rank's slice of dim 0 (the
    first dim0 % size ranks get one extra row). Differentiable."""
    op = _resolve_op(op, None)
    if compression is not _NO_COMPRESSION and compression is not None:
        compressed, ctx = compression.compress(tensor)
        reduced = reducescatter(compressed, name, _NO_COMPRESSION, op, process_set, prescale_factor,
                                postscale_factor)
        return compression.decompress(reduced, ctx)
    if tensor.requires_grad and _grad_enabled():
        return _autograd.Reducescatter.apply(tensor, name, op, process_set, prescale_factor,
                                             postscale_factor)
    return synchronize(_reducescatter_async((tensor,), name, op, prescale_factor,
                                            postscale_factor, process_set, False, drive=True))


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducescattering a list of tensors as one unit; returns a handle."""
    op = _resolve_op(op, None)
    return _reducescatter_async(_nonempty(tensors, "grouped_reducescatter"), name, op,
                                prescale_factor, postscale_factor, process_set, True)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters a list of tensors as one unit; returns a list. Differentiable."""
    op = _resolve_op(op, None)
    tensors = _nonempty(tensors, "grouped_reducescatter")
    if compression is not _NO_COMPRESSION and compression is not None:
        compressed = [compression.compress(t) for t in tensors]
        reduced = grouped_reducescatter([w for w, _ in compressed], name, _NO_COMPRESSION, op,
                                        process_set, prescale_factor, postscale_factor)
        return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]
    if _requires_grad(tensors):
        return list(_autograd.GroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                                         postscale_factor, *tensors))
    return synchronize(_reducescatter_async(tensors, name, op, prescale_factor, postscale_factor,
                                            process_set, True, drive=True))


# ---- join and barrier -----------------------------------------------------------

def _finish_join(state, handles):
    _, shape, _ = _requests.output(handles[0], _ops.UINT8)
    if not shape:
        raise HorovodInternalError("the core reported no last-joined rank for join()")
    return int(shape[0])


def join(device=-1):
    """Marks this rank as done: until every rank has joined, it takes part in other
    ranks' collectives with neutral data. Returns the rank that joined last."""
    spec = (None, _ops.JOIN, 0, _ops.UINT8, device, (), 0, 0, 1.0, 1.0, 0,
            _ops.GLOBAL_PROCESS_SET, None, 1, 0)
    return synchronize(_submit([spec], _finish_join, None, drive=True))


def barrier(process_set=global_process_set):
    """Blocks until every rank of the set has reached the barrier."""
    set_id = _set_id(process_set)
    spec = (None, _ops.BARRIER, 0, _ops.UINT8, _CPU, (), 0, 0, 1.0, 1.0, 0, set_id, None, 1, 0)
    synchronize(_submit([spec], _finish_nothing, None, drive=True))
