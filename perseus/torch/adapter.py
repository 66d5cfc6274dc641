"""PyTorch tensor adapter: torch tensors -> requests, core results -> torch tensors.

Everything else about a request (set id, root, names, splits, rows, dtype rules)
is perseus.common.builder's; handles and waiting are perseus.common.requests'.
Each *_async function submits one call (a tensor or a group) and returns a handle
for synchronize(), which returns the result tensor(s): outputs we allocated, the
inputs themselves for in-place calls (non-contiguous ones written back), or the
core-allocated output viewed as a tensor (allgather, alltoall).

CPU and CUDA tensors; what a CUDA request adds (device, stream, the stream wait at
synchronize, device outputs) is in device.py. Non-contiguous inputs are copied to
contiguous memory (on the current stream for CUDA tensors). Used by
perseus.torch.mpi_ops (Horovod's API), autograd_ops and nn.parallel.
"""

import math

import torch

from perseus.common import builder as _builder
from perseus.common import ops as _ops
from perseus.common import requests as _requests
from perseus.common.exceptions import HorovodInternalError
from perseus.torch import device as _device
from perseus.torch.hold import hold as _hold, pin as _pin  # what a call keeps in flight

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

# Module-level bindings: this is the hot path of every collective.
_ALLREDUCE = _ops.ALLREDUCE
_ALLGATHER = _ops.ALLGATHER
_BROADCAST = _ops.BROADCAST
_ALLTOALL = _ops.ALLTOALL
_REDUCESCATTER = _ops.REDUCESCATTER
_BOOL = _ops.BOOL
_ADASUM = _ops.Adasum
_CPU = _ops.CPU_DEVICE
_Request = _builder.Request
_set_id = _builder.set_id
_names = _builder.names
_check_code = _builder.check_code
_submit = _requests.submit
_grad_enabled = torch.is_grad_enabled
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


def _check_inplace(tensor, op_type):
    """For an in-place collective on `tensor`, which requires grad, in grad mode: refuses
    what torch refuses to write in place (a leaf that requires grad, a view of one, ...)
    with torch's own check and message, and records the write as torch does. Cheap:
    copy_() of a tensor into itself writes nothing. Raised before anything is sent."""
    try:
        tensor.copy_(tensor)
    except RuntimeError as e:
        raise RuntimeError("in-place %s: %s" % (_ops.OP_TYPE_NAMES[op_type], e)) from None


def prepare(tensor):
    """(contiguous tensor with the input's data, core dtype code, device): device is
    ops.CPU_DEVICE or the CUDA ordinal; raises for a device or dtype the core cannot
    take."""
    device = _CPU if tensor.is_cpu else _device.ordinal(tensor)
    code = DTYPE_CODES.get(tensor.dtype)
    if code is None:
        raise ValueError("Perseus does not support tensors of dtype %s (supported: %s)"
                         % (tensor.dtype, ", ".join(str(d) for d in DTYPE_CODES)))
    if tensor.is_contiguous():
        return tensor, code, device
    if tensor.layout is not torch.strided:
        raise NotImplementedError("%s tensors are not supported" % tensor.layout)
    return tensor.contiguous(), code, device


def _on_device(request, device):
    """A CUDA request: its ordinal and the caller's current stream, where the core
    records the event the collective waits for. Returns requests.submit's
    consumer_stream for it."""
    request.device = device
    request.stream = _device.current_stream(device)
    return _device.consumer(device)


# ---- result -> tensor -----------------------------------------------------------

def _finish_outputs(state, handles):
    """Outputs we allocated (or the inputs, in place); copies back non-contiguous
    in-place inputs (CUDA: on the current stream, which has waited for the result)."""
    _, results, copy_back, grouped, placed = state
    for target, address in placed:
        if target.data_ptr() != address:
            raise ValueError(
                "the tensor (now of shape %s) of an in-place collective got other memory "
                "(set_(), resize_() or .data =) while the request was in flight, so the "
                "result is not in it (it went to the former memory); change a tensor's "
                "storage only after synchronize()" % (tuple(target.shape),))
    if copy_back:
        with torch.no_grad():  # accepted at submission: autograd was told then
            for target, source in copy_back:
                target.copy_(source)
    return results if grouped else results[0]


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
    _, codes, devices, grouped = state
    results = [tensor_from_core(h, code, device)
               for h, code, device in zip(handles, codes, devices)]
    return [r[0] for r in results] if grouped else results[0][0]


def _finish_alltoall(state, handles):
    _, code, device = state
    output, recv = tensor_from_core(handles[0], code, device)
    return output, torch.tensor(recv or (), dtype=torch.int32)


def _finish_join(state, handles):
    _, shape, _ = _requests.output(handles[0], _ops.UINT8)
    if not shape:
        raise HorovodInternalError("the core reported no last-joined rank for join()")
    return int(shape[0])


def _finish_nothing(state, handles):
    return None


# ---- submission -----------------------------------------------------------------

def _same_shape_async(op_type, tensors, inplace, name, reduce_op, prescale, postscale,
                      process_set, root_rank, grouped, drive, pin=True):
    """Allreduce and broadcast: output has the input's shape; we allocate it."""
    sid = _set_id(process_set)
    requests = []
    held = []  # sources and storages, until synchronize (see hold.py)
    results = []
    copy_back = []
    placed = []  # in-place targets and their addresses, checked at synchronize
    consumer = None
    for tensor, wire in zip(tensors, _names(op_type, name, len(tensors), grouped)):
        try:
            source, code, device = prepare(tensor)
        except AttributeError:
            refuse_non_tensors(_ops.OP_TYPE_NAMES[op_type], tensors, grouped)
            raise
        _hold(held, source)
        if code == _BOOL or reduce_op == _ADASUM:
            _check_code(op_type, reduce_op, code)
        if inplace:
            if tensor.requires_grad and _grad_enabled():
                _check_inplace(tensor, op_type)
            output = source
            results.append(tensor)
            placed.append((tensor, tensor.data_ptr()))
            if source is not tensor:
                # Checked before anything is sent: writing the result back into an
                # expanded view would fail only after every rank ran the collective.
                if any(st == 0 and n > 1 for n, st in zip(tensor.shape, tensor.stride())):
                    raise ValueError("in-place %s of a tensor whose elements share memory "
                                     "(e.g. from expand()); clone() it first"
                                     % _ops.OP_TYPE_NAMES[op_type])
                copy_back.append((tensor, source))
        elif source is not tensor:
            output = source  # already a private copy: reduce into it
            results.append(source)
        else:
            output = torch.empty_like(source)  # source is contiguous, so is this
            results.append(output)
        # Positional up to root_rank (the hot path); see builder.Request.
        request = _Request(op_type, sid, code, source.shape, source.data_ptr(),
                           output.data_ptr(), wire, reduce_op, prescale, postscale, root_rank)
        if device != _CPU:
            consumer = _on_device(request, device)
        requests.append(request)
    _builder.group(requests, grouped)
    if inplace:
        # As torch's in-place ops, when the write is issued: autograd then refuses a
        # backward that needs a value saved before it.
        _increment_version(results)
    if pin:
        held.append(_pin(held, drive))
    return _submit(requests, _finish_outputs, (held, results, copy_back, grouped, placed),
                   drive, consumer)


def allreduce_async(tensors, inplace, name, op, prescale, postscale, process_set, grouped,
                    drive=False, pin=True):
    """Reduces `tensors` (a list; grouped: synchronize() returns a list) over the set.
    pin=False: the inputs are only held, not pinned against a growing resize_() (see
    hold.py), for a caller that owns them until synchronize()."""
    return _same_shape_async(_ALLREDUCE, tensors, inplace, name, op, prescale, postscale,
                             process_set, 0, grouped, drive, pin)


class InplaceAllreduce:
    """allreduce_async_ of one tensor under a fixed name, op, scales and set, submitted
    again and again (DistributedOptimizer: a parameter's gradient, every step).

    submit(tensor) reuses the request packed for the previous tensor while the new
    one has its dtype, shape and device and is contiguous, refreshing only its
    address (and, on a GPU, the caller's current stream): the per-gradient cost of a
    training step; otherwise it takes the general path. prepared() and
    submit_prepared() do the same for many tensors in one enqueue. The tensor is
    held, not pinned (pin=False above): its owner must not resize it before
    synchronize()."""

    __slots__ = ("_name", "_op", "_prescale", "_postscale", "_process_set", "_key",
                 "_prebuilt")

    def __init__(self, name, op, prescale, postscale, process_set):
        self._name = name
        self._op = op
        self._prescale = prescale
        self._postscale = postscale
        self._process_set = process_set
        self._key = None
        self._prebuilt = None

    def submit(self, tensor):
        """Starts reducing `tensor` in place; returns the handle for synchronize()."""
        prebuilt = self.prepared(tensor)
        if prebuilt is None:
            return self.submit_unprepared(tensor)
        return submit_prepared(((prebuilt, tensor),), grouped=False)

    def submit_unprepared(self, tensor):
        """submit() of a tensor that prepared() refused: the general path."""
        return allreduce_async((tensor,), True, self._name, self._op, self._prescale,
                               self._postscale, self._process_set, False, pin=False)

    def prepared(self, tensor):
        """The request packed for `tensor` (a builder.Prebuilt), or None where the
        general path must take it. Keeps the last one it took from the cache of packed
        requests, so a step's tensor costs one comparison."""
        key = (tensor.dtype, tensor.shape, tensor.device, self._process_set.process_set_id)
        if key != self._key:
            if not self._prepare(tensor, key):
                return None
        elif not tensor.is_contiguous():
            return None
        return self._prebuilt

    def _prepare(self, tensor, key):
        """Takes the request for tensors like `tensor` from the cache of packed
        requests; False where the general path must take it (non-contiguous)."""
        self._key = self._prebuilt = None
        source, code, device = prepare(tensor)  # raises for what the core cannot take
        if source is not tensor:
            return False
        self._prebuilt = _packed(self._name, self._op, self._prescale, self._postscale,
                                 self._process_set, tensor, code, device)
        self._key = key
        return True


def submit_prepared(items, grouped=True, drive=False):
    """Starts the in-place allreduces of (InplaceAllreduce.prepared(tensor), tensor)
    pairs in one enqueue; returns one handle for all (synchronize() gives the
    tensors as a list, or the tensor when grouped is False). drive=True: the caller
    waits at once, so this thread runs the engine (requests.enqueue). GPU tensors go
    with the caller's current stream, which synchronize() then makes wait."""
    packed, held, placed, tensors = [], [], [], []
    consumer = None
    for prebuilt, tensor in items:
        if tensor.requires_grad and _grad_enabled():
            _check_inplace(tensor, _ALLREDUCE)
        address = tensor.data_ptr()
        stream = 0
        if prebuilt.device != _CPU:
            stream = _device.current_stream(prebuilt.device)
            consumer = _device.consumer(prebuilt.device)
        packed.append((prebuilt, address, address, stream))
        held.append((prebuilt, tensor, tensor.untyped_storage()))  # what set_() would free
        placed.append((tensor, address))
        tensors.append(tensor)
    _increment_version(tensors)  # as in _same_shape_async
    return _requests.submit_packed(_builder.pack_prebuilt(packed), _finish_outputs,
                                   (held, tensors, (), grouped, placed), drive, consumer)


# The packed in-place allreduce requests (builder.Prebuilt) of both fast paths,
# InplaceAllreduce and allreduce_now_, by name, op, scales, set id, dtype and shape,
# and the device ordinal for a GPU tensor (CPU keys, allreduce_now_'s, stay shorter
# to build and hash). allreduce_now_ marks a key with None at its first call and packs
# from its second (packing costs more than one general call, so names made anew per
# call never pay it). Cleared when full, so such names cannot grow it either; an
# InplaceAllreduce keeps the request it took.
_packed_requests = {}
_PACKED_REQUESTS_LIMIT = 1024
_UNSEEN = object()


def _remember(key, prebuilt):
    """Stores `prebuilt` (None: a key seen once) under `key`; returns it."""
    if len(_packed_requests) >= _PACKED_REQUESTS_LIMIT:
        _packed_requests.clear()
    _packed_requests[key] = prebuilt
    return prebuilt


def _packed(name, op, prescale, postscale, process_set, tensor, code, device):
    """The packed in-place allreduce of contiguous `tensor` (core dtype `code`, on
    `device`), from the cache or packed now; raises what the general path raises for
    a dtype the op refuses or a set that is not registered."""
    _check_code(_ALLREDUCE, op, code)
    sid = _set_id(process_set)
    key = (name, op, prescale, postscale, sid, tensor.dtype, tensor.shape)
    if device != _CPU:
        key += (device,)
    prebuilt = _packed_requests.get(key)
    if prebuilt is None:
        request = _Request(_ALLREDUCE, sid, code, tuple(tensor.shape), 0, 0,
                           _names(_ALLREDUCE, name)[0], op, prescale, postscale, device=device)
        prebuilt = _remember(key, _builder.Prebuilt(request))
    return prebuilt


def allreduce_now_(tensor, name, op, prescale, postscale, process_set):
    """allreduce_ of one tensor that the caller waits for at once (mpi_ops.allreduce_):
    a contiguous CPU tensor under a name used before with the same settings reuses
    the request packed for it (_packed_requests), so a loop's call skips the packing;
    anything else (GPU tensors too: their first call is rarely repeated in a loop
    that would gain) takes the general path."""
    try:
        fast = name is not None and tensor.is_cpu and tensor.is_contiguous()
    except AttributeError:
        refuse_non_tensors(_ops.OP_TYPE_NAMES[_ALLREDUCE], (tensor,))
        raise
    if fast:
        # _packed()'s key, for a CPU tensor.
        key = (name, op, prescale, postscale, process_set.process_set_id, tensor.dtype,
               tensor.shape)
        prebuilt = _packed_requests.get(key, _UNSEEN)
        if prebuilt is _UNSEEN:  # the first call: remember the key, take the general path
            prebuilt = _remember(key, None)
        elif prebuilt is None:
            code = prepare(tensor)[1]  # raises for a dtype the core cannot take
            prebuilt = _packed(name, op, prescale, postscale, process_set, tensor, code, _CPU)
        if prebuilt is not None:
            return submit_prepared(((prebuilt, tensor),), grouped=False, drive=True)
    return allreduce_async((tensor,), True, name, op, prescale, postscale, process_set, False,
                           drive=True)


def broadcast_async(tensors, inplace, root_rank, name, process_set, grouped=False, drive=False):
    """Broadcasts global rank root_rank's `tensors` over the set."""
    return _same_shape_async(_BROADCAST, tensors, inplace, name, 0, 1.0, 1.0, process_set,
                             _builder.root_in_set(process_set, root_rank), grouped, drive)


def allgather_async(tensors, name, process_set, grouped, drive=False):
    """The core sizes and allocates the output; synchronize wraps it zero-copy."""
    sid = _set_id(process_set)
    requests = []
    held = []
    codes = []
    devices = []
    consumer = None
    for tensor, wire in zip(tensors, _names(_ALLGATHER, name, len(tensors), grouped)):
        try:
            source, code, device = prepare(tensor)
        except AttributeError:
            refuse_non_tensors(_ops.OP_TYPE_NAMES[_ALLGATHER], tensors, grouped)
            raise
        request = _Request(_ALLGATHER, sid, code, source.shape, source.data_ptr(), name=wire)
        if device != _CPU:
            consumer = _on_device(request, device)
        requests.append(request)
        _hold(held, source)
        codes.append(code)
        devices.append(device)
    _builder.group(requests, grouped)
    held.append(_pin(held, drive))
    return _submit(requests, _finish_gathered, (held, codes, devices, grouped), drive,
                   consumer)


def alltoall_async(tensor, splits, name, process_set, drive=False):
    """synchronize() returns (output, received splits as an int32 tensor)."""
    sid = _set_id(process_set)
    try:
        source, code, device = prepare(tensor)
    except AttributeError:
        refuse_non_tensors(_ops.OP_TYPE_NAMES[_ALLTOALL], (tensor,))
        raise
    _builder.check_rows(_ALLTOALL, source.shape)
    splits = _builder.alltoall_splits(splits, process_set, source.shape[0])
    request = _Request(_ALLTOALL, sid, code, source.shape, source.data_ptr(),
                       name=_names(_ALLTOALL, name)[0], splits=splits)
    consumer = None if device == _CPU else _on_device(request, device)
    held = []
    _hold(held, source)
    held.append(_pin(held, drive))
    return _submit([request], _finish_alltoall, (held, code, device), drive, consumer)


def reducescatter_async(tensors, name, op, prescale, postscale, process_set, grouped,
                        drive=False):
    """Output: this rank's rows of dim 0 (builder.scatter_rows); we allocate it."""
    _builder.check_op(_REDUCESCATTER, op)
    sid = _set_id(process_set)
    requests = []
    held = []
    results = []
    consumer = None
    for tensor, wire in zip(tensors, _names(_REDUCESCATTER, name, len(tensors), grouped)):
        try:
            source, code, device = prepare(tensor)
        except AttributeError:
            refuse_non_tensors(_ops.OP_TYPE_NAMES[_REDUCESCATTER], tensors, grouped)
            raise
        _check_code(_REDUCESCATTER, op, code)
        _builder.check_rows(_REDUCESCATTER, source.shape)
        rows = _builder.scatter_rows(source.shape[0], process_set)
        output = source.new_empty((rows,) + source.shape[1:])  # on the input's device
        request = _Request(_REDUCESCATTER, sid, code, source.shape, source.data_ptr(),
                           output.data_ptr(), wire, op, prescale, postscale)
        if device != _CPU:
            consumer = _on_device(request, device)
        requests.append(request)
        _hold(held, source)
        results.append(output)
    _builder.group(requests, grouped)
    held.append(_pin(held, drive))
    return _submit(requests, _finish_outputs, (held, results, (), grouped, ()), drive,
                   consumer)


def join():
    """Joins (see mpi_ops.join) and waits; returns the rank that joined last. A
    control request: it carries no tensor, so it goes as a CPU request whatever
    device the caller named (the core would treat it so anyway, but a device here
    would make the core load CUDA)."""
    request = _Request(_ops.JOIN, _ops.GLOBAL_PROCESS_SET, _ops.UINT8, ())
    return synchronize(_submit([request], _finish_join, None, drive=True))


def barrier(process_set):
    """Waits until every rank of the set has reached the barrier."""
    request = _Request(_ops.BARRIER, _set_id(process_set), _ops.UINT8, ())
    synchronize(_submit([request], _finish_nothing, None, drive=True))
