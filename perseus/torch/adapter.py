"""PyTorch tensor adapter: torch tensors -> requests, core results -> torch tensors.

Every torch collective reaches the core through submit(): the Horovod API
(mpi_ops, autograd_ops), DistributedOptimizer's gradients and buckets, the drop-in
DDP and the "perseus" torch.distributed backend. It submits one call (a tensor, a
group, or a batch of named tensors) and returns a handle for synchronize(), which
returns the result tensor(s): outputs we allocated, the inputs themselves for
in-place calls (non-contiguous ones written back), or the core-allocated output
viewed as a tensor (allgather, alltoall). Its fast path: a named request submitted
before with the same settings, dtype, shape and device reuses its packed record;
a named in-place call of one CPU tensor that repeats its last call (allreduce_ in
a loop) finds that record by its settings alone (_submit_repeat).

Everything else about a request (set id, root, names) is perseus.common.builder's,
and the rules on dtypes and dim 0 are the core's, asked through builder; handles
and waiting are perseus.common.requests'. CPU and CUDA tensors; what a CUDA request
adds (device, stream, the stream wait at synchronize, device outputs) is in
device.py. Non-contiguous inputs are copied to contiguous memory (on the current
stream for CUDA tensors).
"""

import math

import torch

from perseus.common import builder as _builder
from perseus.common import ops as _ops
from perseus.common import requests as _requests
from perseus.common.exceptions import HorovodInternalError
from perseus.torch import device as _device
from perseus.torch.keepalive import keep as _keep, pin as _pin  # what a call keeps in flight

# The one torch dtype <-> core dtype table.
DTYPE_CODES = {
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
_TORCH_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}

_CPU = _ops.CPU_DEVICE
# torch.autograd.graph.increment_version without its Python wrapper: takes a list of
# tensors; a tensor without a version counter (made under inference_mode) is skipped.
_increment_version = torch._C._increment_version

poll = _requests.poll
synchronize = _requests.synchronize


# ---- tensor -> request ----------------------------------------------------------

def not_a_tensor(what, argument, value):
    """The TypeError for `value`, given as `argument` to `what`, not a torch.Tensor."""
    kind = type(value)
    if kind.__module__ != "builtins":
        kind = "%s.%s" % (kind.__module__, kind.__qualname__)
    else:
        kind = kind.__qualname__
    return TypeError("%s expects a torch.Tensor as %s, got %s" % (what, argument, kind))


def refuse_non_tensors(what, tensors, grouped=False):
    """Raises not_a_tensor() for the first of `tensors` that is not a torch.Tensor;
    returns if all are. The hot paths use tensor attributes unchecked and call this
    only when that raised AttributeError, so the check costs nothing per call."""
    for i, tensor in enumerate(tensors):
        if not isinstance(tensor, torch.Tensor):
            raise not_a_tensor(what, "tensors[%d]" % i if grouped else "tensor", tensor) from None


def prepare(tensor):
    """(contiguous tensor with the input's data, core dtype code, device): device is
    ops.CPU_DEVICE or the CUDA ordinal; raises for a device or dtype the core cannot
    take."""
    device = _CPU if tensor.is_cpu else _device.ordinal(tensor)
    code = DTYPE_CODES.get(tensor.dtype)
    if code is None:
        raise ValueError("Perseus does not support tensors of dtype %s (supported: %s)"
                         % (tensor.dtype, ", ".join(str(d) for d in DTYPE_CODES)))
    if tensor.layout is not torch.strided:  # asked first: is_contiguous() raises for CSR
        raise NotImplementedError("%s tensors are not supported" % tensor.layout)
    if tensor.is_contiguous():
        return tensor, code, device
    return tensor.contiguous(), code, device


def _in_place(tensor, source, op_type):
    """The checks of an in-place collective on `tensor` that requires grad in grad
    mode, or whose data `source` is a contiguous copy (the request's output, written
    back into `tensor` at synchronize). Refused before anything is sent: what torch
    refuses to write in place in grad mode (a leaf that requires grad, a view of one,
    ...; torch's own check and message, which also records the write: copy_() of a
    tensor into itself writes nothing), and an expanded view, whose write-back would
    fail only after every rank ran the collective."""
    if tensor.requires_grad and torch.is_grad_enabled():
        try:
            tensor.copy_(tensor)
        except RuntimeError as e:
            raise RuntimeError("in-place %s: %s" % (_ops.OP_TYPE_NAMES[op_type], e)) from None
    if source is not tensor:
        if any(st == 0 and n > 1 for n, st in zip(tensor.shape, tensor.stride())):
            raise ValueError("in-place %s of a tensor whose elements share memory (e.g. "
                             "from expand()); clone() it first" % _ops.OP_TYPE_NAMES[op_type])


def _output(op_type, tensor, source, code, device, process_set):
    """What synchronize() returns for `tensor` when the call is not in place: a tensor
    we allocate (a contiguous copy of the input is reduced into), or (code, device)
    of the output the core allocates (allgather, alltoall)."""
    if op_type == _ops.ALLGATHER or op_type == _ops.ALLTOALL:
        return code, device
    if op_type == _ops.REDUCESCATTER:
        rows = _builder.scatter_rows(source.shape, process_set)
        return source.new_empty((rows,) + source.shape[1:])  # on the input's device
    if source is not tensor:
        return source  # already a private copy: reduce into it
    return torch.empty_like(source)  # source is contiguous, so is this


# ---- result -> tensor -----------------------------------------------------------

def _finish_outputs(state, handles):
    """Outputs we allocated (or the inputs, in place); copies back non-contiguous
    in-place inputs (CUDA: on the current stream, which has waited for the result)."""
    _, results, listed, placed = state
    for target, address, _ in placed:
        if target.data_ptr() != address:
            raise ValueError(
                "the tensor (now of shape %s) of an in-place collective got other memory "
                "(set_(), resize_() or .data =) while the request was in flight, so the "
                "result is not in it (it went to the former memory); change a tensor's "
                "storage only after synchronize()" % (tuple(target.shape),))
    for target, _, source in placed:
        if source is not target:
            with torch.no_grad():  # accepted at submission: autograd was told then
                target.copy_(source)
    if listed is tuple:
        return tuple(results)
    return results if listed else results[0]


def tensor_from_core(handle, code, device=_CPU):
    """The core-allocated output of `handle` as a tensor (CPU: viewing the core's
    memory; CUDA: see device.tensor_from_core), and the received splits (alltoall)
    or None."""
    dtype = _TORCH_DTYPES[code]
    if device != _CPU:
        return _device.tensor_from_core(handle, dtype, device)
    buffer, shape, recv = _requests.output(handle, code)
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype), recv
    if buffer is None:
        raise HorovodInternalError("the core returned no buffer for an output of shape %s"
                                   % (shape,))
    return torch.frombuffer(buffer, dtype=dtype, count=numel).view(shape), recv


def _finish_gathered(state, handles):
    _, results, listed, _ = state
    outputs = [tensor_from_core(h, *result)[0] for h, result in zip(handles, results)]
    return outputs if listed else outputs[0]


def _finish_alltoall(state, handles):
    output, recv = tensor_from_core(handles[0], *state[1][0])
    return output, torch.tensor(recv or (), dtype=torch.int32)


_FINISH = {_ops.ALLREDUCE: _finish_outputs, _ops.BROADCAST: _finish_outputs,
           _ops.REDUCESCATTER: _finish_outputs, _ops.ALLGATHER: _finish_gathered,
           _ops.ALLTOALL: _finish_alltoall}


def _finish_join(state, handles):
    _, shape, _ = _requests.output(handles[0], _ops.UINT8)
    if not shape:
        raise HorovodInternalError("the core reported no last-joined rank for join()")
    return int(shape[0])


def _finish_nothing(state, handles):
    return None


# ---- submission -----------------------------------------------------------------
# The packed requests of named calls (builder.Prebuilt), by their call's settings,
# name, dtype, shape and device: a call whose every request is here is packed by
# copying records and filling in addresses (builder.pack_prebuilt), skipping names,
# layouts and checks: the per-call cost of a training step's gradients and buckets.
# Cleared when full, so names made anew per call cannot grow it.
_packed_requests = {}
_PACKED_REQUESTS_LIMIT = 4096
# The fast path of a repeated named in-place call of one CPU tensor (allreduce_ in a
# loop, a DistributedOptimizer bucket): its settings (op type, name, set id, the set
# object's id, op, scales, root) -> (Prebuilt, dtype, shape) of its last call, checked
# before the general path's preparing, checks and longer key.
_repeats = {}


def submit(op_type, tensors, name, process_set, grouped=False, *, inplace=False,
           op=_ops.Sum, prescale=1.0, postscale=1.0, root_rank=0, splits=None, drive=False,
           pin=True, as_tuple=False):
    """Submits one collective call on `tensors` in one perseus_enqueue; returns the
    handle for synchronize(), which returns a list (grouped, or `name` a list; a tuple
    for a grouped call with as_tuple, as Horovod's grouped allreduce handles give) or
    the one result. name: None (numbered names), a str (a grouped call's members get
    "<name>.<i>"), or a list, a name per tensor: requests enqueued together, not a
    group (DistributedOptimizer's gradients). inplace: allreduce and broadcast write
    into the tensors. root_rank: broadcast's, a global rank. splits: alltoall's, or
    None (even). drive: the caller waits at once (True), so this thread runs the
    engine, or soon (requests.SOON), and runs it then; either way the caller does
    nothing to the tensors meanwhile, so nothing is pinned. pin: pin CPU storages
    against a growing resize_() while in flight (keepalive.py); False for a caller
    that owns the tensors until synchronize() (the optimizer)."""
    sid = _builder.set_id(process_set)
    if op_type == _ops.BROADCAST:
        root_rank = _builder.root_in_set(process_set, root_rank)
    repeat = None
    if inplace and not grouped and type(name) is str and len(tensors) == 1:
        repeat = (op_type, name, sid, id(process_set), op, prescale, postscale, root_rank)
        handle = _submit_repeat(repeat, tensors[0], drive, pin)
        if handle is not None:
            return handle
    listed = tuple if as_tuple else grouped or isinstance(name, list)
    group_size = len(tensors) if grouped else 0
    kept, results, requests, items = [], [], [], []
    placed = [] if inplace else ()  # in-place targets: (tensor, its address, its data)
    consumer = None
    for i, tensor in enumerate(tensors):
        try:
            source, code, device = prepare(tensor)
        except AttributeError:
            refuse_non_tensors(_ops.OP_TYPE_NAMES[op_type], tensors, listed)
            raise
        if op_type == _ops.ALLTOALL:
            splits = _builder.alltoall_splits(splits, process_set, source.shape)
        prebuilt = key = None
        if name is not None:
            key = (op_type, op, prescale, postscale, sid, root_rank, group_size,
                   name[i] if listed and not grouped else (name, i) if grouped else name,
                   code, source.shape, device, splits)
            prebuilt = _packed_requests.get(key)
        if prebuilt is None:  # else it met the core's rules when it was packed
            _builder.check_code(op_type, op, code)
        input_at = output_at = source.data_ptr()
        if inplace:
            if source is not tensor or tensor.requires_grad and torch.is_grad_enabled():
                _in_place(tensor, source, op_type)
            placed.append((tensor, input_at if source is tensor else tensor.data_ptr(), source))
            results.append(tensor)
        else:
            output = _output(op_type, tensor, source, code, device, process_set)
            results.append(output)
            output_at = output.data_ptr() if isinstance(output, torch.Tensor) else 0
        _keep(kept, source)
        stream = 0
        if device != _CPU:
            stream = _device.current_stream(device)
            consumer = _device.consumer(device)
        if prebuilt is None:
            requests.append(_builder.Request(op_type, sid, code, source.shape, input_at,
                                             output_at, None, op, prescale, postscale, root_rank,
                                             splits, device, stream, 0, group_size))
        items.append((prebuilt, input_at, output_at, stream, key))
    if inplace:
        # As torch's in-place ops, when the write is issued: autograd then refuses a
        # backward that needs a value saved before it.
        _increment_version(results)
    if pin and not drive:
        kept.append(_pin(kept, drive))
    if name is None:
        packed = _builder.pack(_builder.group(requests, grouped))
    else:  # copies of the records packed before (`kept` keeps them until synchronize())
        if requests:
            _pack_new(op_type, name, grouped, requests, items)
        kept.append(items)
        packed = _builder.pack_prebuilt(items)
        if repeat is not None and device == _CPU and source is tensor:
            _repeats[repeat] = (items[0][0], tensor.dtype, source.shape)
    return _requests.submit(packed, _FINISH[op_type], (kept, results, listed, placed), drive,
                            consumer)


def run_inplace(op_type, tensor, name, process_set, *, op=_ops.Sum, prescale=1.0,
                postscale=1.0, root_rank=0, bound=None, failed=None):
    """submit() and synchronize() of one tensor's in-place call (allreduce_,
    broadcast_): returns the tensor. A named CPU call that repeats its last call's
    settings, dtype and shape (the loop of a benchmark, a step) goes to the core in one
    call (_run_repeat). bound and failed: see requests.run (a torch process group's
    timeout; a Work that reports the error later, whose failed(error) is returned)."""
    if type(name) is str:
        # The key of submit()'s repeat: set_id() checked the set when it was made.
        sid = process_set.process_set_id
        root = root_rank if op_type != _ops.BROADCAST or sid == _ops.GLOBAL_PROCESS_SET else None
        done = _run_repeat((op_type, name, sid, id(process_set), op, prescale, postscale, root),
                           tensor, bound, failed)
        if done is not None:
            return done
    return _requests.settled(submit(op_type, (tensor,), name, process_set, inplace=True, op=op,
                                    prescale=prescale, postscale=postscale,
                                    root_rank=root_rank, drive=True), bound, failed)


def _run_repeat(repeat, tensor, bound=None, failed=None):
    """run_inplace() of a repeated call, in one perseus_run: None if it is not one (the
    record of _submit_repeat). Its checks are _submit_repeat's, written out in both: a
    shared helper is one more Python call on the small call's path
    (tests/mpi/test_call_budget.py)."""
    entry = _repeats.get(repeat)
    if entry is None:
        return None
    prebuilt, dtype, shape = entry
    try:
        if not (tensor.is_cpu and tensor.dtype is dtype and tensor.shape == shape
                and tensor.is_contiguous()):
            return None
    except AttributeError:
        return None  # not a tensor: the general path says so
    if tensor.requires_grad and torch.is_grad_enabled():
        _in_place(tensor, tensor, repeat[0])
    address = tensor.data_ptr()
    state = (tensor, address, tensor.untyped_storage())  # the memory, kept until done
    _increment_version(state[:1])
    return _requests.run(prebuilt.pack_alone(address, address), _finish_repeat, state, bound,
                         failed)


def _finish_repeat(state, handles):
    tensor, address, _ = state
    if tensor.data_ptr() != address:
        _finish_outputs((None, None, None, ((tensor, address, tensor),)), handles)  # raises
    return tensor


def _submit_repeat(repeat, tensor, drive, pin):
    """submit() of one named in-place CPU tensor under settings `repeat` whose last
    call had this tensor's dtype and shape, contiguous: the handle, from the request
    packed then (the rules were met then, and dtype, shape and device are all that
    the request takes from the tensor); None for anything else (the general path)."""
    entry = _repeats.get(repeat)
    if entry is None:
        return None
    prebuilt, dtype, shape = entry
    try:
        if not (tensor.is_cpu and tensor.dtype is dtype and tensor.shape == shape
                and tensor.is_contiguous()):
            return None
    except AttributeError:
        return None  # not a tensor: the general path says so
    if tensor.requires_grad and torch.is_grad_enabled():
        _in_place(tensor, tensor, repeat[0])
    address = tensor.data_ptr()
    kept = []
    _keep(kept, tensor)
    results = [tensor]
    _increment_version(results)
    if pin and not drive:
        kept.append(_pin(kept, drive))
    items = [(prebuilt, address, address, 0, None)]
    kept.append(items)
    return _requests.submit(_builder.pack_prebuilt(items), _finish_outputs,
                            (kept, results, False, [(tensor, address, tensor)]), drive)


def _pack_new(op_type, name, grouped, requests, items):
    """Packs the `requests` of a named call's `items` that were not packed before,
    and keeps them for the next calls: each item gets its Prebuilt."""
    if isinstance(name, list):
        wires = [_builder.wire_name(op_type, n) for n in name]
    else:
        wires = _builder.names(op_type, name, len(items), grouped)
    missing = [i for i, item in enumerate(items) if item[0] is None]
    for request, i in zip(requests, missing):
        request.name = wires[i]
    buf, n = _builder.pack(requests)
    if len(_packed_requests) + n > _PACKED_REQUESTS_LIMIT:
        _packed_requests.clear()
        _repeats.clear()  # so it stays no larger than _packed_requests
    for j, i in enumerate(missing):
        _, input_at, output_at, stream, key = items[i]
        prebuilt = _packed_requests[key] = _builder.Prebuilt(buf, n, j)
        items[i] = (prebuilt, input_at, output_at, stream, key)


def point_to_point(recv, tensor, peer, tag, process_set):
    """Sends `tensor` to, or receives it (in place) from, set rank `peer` (recv: -1
    for any; CPU only) with `tag`: a handle whose synchronize() returns the peer's set
    rank. Tensors of any dtype the core knows; the bytes go as they are. A CUDA tensor
    is read (written) after the current stream's work, over NCCL, and synchronize()
    makes the then current stream wait for the message, as for a collective."""
    source, _, device = prepare(tensor)
    if recv and source is not tensor:
        raise ValueError("recv: the tensor must be contiguous (it is received in place)")
    nbytes = source.numel() * source.element_size()
    stream, consumer = None, None
    if device != _CPU:
        stream, consumer = _device.current_stream(device), _device.consumer(device)
    return _requests.point_to_point(recv, source.data_ptr(), nbytes, peer, tag,
                                    _builder.set_id(process_set), source, device, stream,
                                    consumer)


def join():
    """Joins (see mpi_ops.join) and waits; returns the rank that joined last. A
    control request: it carries no tensor, so it goes as a CPU request whatever
    device the caller named (the core would treat it so anyway, but a device here
    would make the core load CUDA)."""
    request = _builder.Request(_ops.JOIN, _ops.GLOBAL_PROCESS_SET, _ops.UINT8, ())
    return synchronize(_requests.submit(_builder.pack([request]), _finish_join, None,
                                        drive=True))


def barrier(process_set):
    """Waits until every rank of the set has reached the barrier."""
    synchronize(barrier_async(process_set, drive=True))


def barrier_async(process_set, name=None, drive=False):
    """A barrier's handle; `name` as for the other collectives (None: numbered)."""
    request = _builder.Request(_ops.BARRIER, _builder.set_id(process_set), _ops.UINT8, (),
                               name=_builder.names(_ops.BARRIER, name)[0])
    return _requests.submit(_builder.pack([request]), _finish_nothing, None, drive=drive)
