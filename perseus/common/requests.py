"""Framework-neutral request submission: names, enqueue, handles, outputs.

Adapters describe each tensor as a request tuple (field order of RequestSpec) and
hand a whole batch to submit(): a grouped op or a list of tensors becomes ONE
perseus_enqueue call, so the core negotiates it as one unit. The handle table
lives here too, so no adapter re-implements it.

This is the hot path of every collective. It is written to do little per tensor:
a batch is packed into one buffer (handles_out, request records, shapes/splits,
names) with struct, which is several times cheaper than building ctypes objects,
and the ctypes functions are bound once at import.
"""

import array
import ctypes
import itertools
import math
import struct
import weakref
from typing import NamedTuple, Optional, Tuple

from perseus.common import exceptions
from perseus.common import library as _lib
from perseus.common.ops import DTYPE_SIZES, OP_TYPE_NAMES


class RequestSpec(NamedTuple):
    """One request, in the order enqueue() reads it.

    Adapters may pass plain tuples with the same 15 fields (cheaper to build);
    this class documents the order and serves slower, readable call sites.
    """
    name: Optional[bytes]    # wire_name(op_type, name), or None: enqueue() names it
    op_type: int             # ops.ALLREDUCE, ...
    reduce_op: int           # ops.Sum, ... (allreduce, reducescatter; else 0)
    dtype: int               # ops.FLOAT32, ...
    device: int              # ops.CPU_DEVICE or a GPU ordinal
    shape: Tuple[int, ...]   # input shape (a torch.Size works: it is a tuple)
    input: int               # address of the input buffer (0 when empty)
    output: int              # address of the output buffer, 0 = core allocates
    prescale: float
    postscale: float
    root_rank: int           # broadcast root, rank within the process set
    process_set: int         # process set id, 0 = global
    splits: Optional[Tuple[int, ...]]  # alltoall rows per rank, None = even
    anonymous: int           # 1 when the name was generated (forced for name None)
    stream: int              # GPU stream handle, 0 on CPU


# ---- names ------------------------------------------------------------------------
# Unnamed requests are numbered per (op type, process set): every rank that makes
# the same calls on a set counts the same way, independent of its traffic on other
# sets. Numbers are drawn inside enqueue(), after the adapter has validated its
# tensors, so a call rejected in Python does not shift later names on one rank
# only. itertools.count's next() is atomic under the GIL, so threads are safe.
_counters = {}  # (op_type, process_set) -> (name format as bytes, counter)


def _unnamed(op_type, process_set):
    """The next generated name: "<op>.noname.<k>", "<op>.set<id>.noname.<k>" off
    the global set."""
    entry = _counters.get((op_type, process_set))
    if entry is None:
        if process_set:
            fmt = "%s.set%d.noname.%%d" % (OP_TYPE_NAMES[op_type], process_set)
        else:
            fmt = "%s.noname.%%d" % OP_TYPE_NAMES[op_type]
        entry = _counters.setdefault((op_type, process_set), (fmt.encode(), itertools.count()))
    return entry[0] % next(entry[1])


def wire_name(op_type, name):
    """The wire name of a user-named request: "<op>.<name>", as Horovod."""
    wire = ("%s.%s" % (OP_TYPE_NAMES[op_type], name)).encode()
    if b"\0" in wire:
        raise ValueError("request name %r contains a NUL character" % (name,))
    return wire


# ---- enqueue --------------------------------------------------------------------
_STRIDE = _lib.REQUEST_SIZE
_pack_request = _lib.REQUEST_STRUCT.pack_into
_enqueue = _lib.perseus_enqueue
_enqueue_and_drive = _lib.perseus_enqueue_and_drive
# How long a caller that waits at once runs the engine itself before leaving the
# rest to the engine thread (and to sliced waits, so Ctrl-C is honoured).
_DRIVE_S = 0.5
_int64_structs = {}


def _int64s(count):
    """A cached struct.Struct for `count` int64s (formatting one per call is slow)."""
    packer = _int64_structs.get(count)
    if packer is None:
        packer = _int64_structs[count] = struct.Struct("%dq" % count)
    return packer


def enqueue(specs, drive=False):
    """Submits a batch of requests in one perseus_enqueue call.

    drive=True is for a caller that waits at once: this thread then runs the engine
    until the requests complete, so no thread hand-off is on the latency path.

    Returns (handles, keepalive): the core handles (a tuple, one per spec) and the
    buffer that holds the names, shapes and splits the core may read until every
    handle completes. The caller keeps `keepalive` (and the tensors behind the
    input/output addresses) alive until then; submit() does this for you.
    """
    buf, n = pack(specs)
    base = buf.buffer_info()[0]
    if drive:
        status = _enqueue_and_drive(base + 8 * n, n, base, _DRIVE_S)
    else:
        status = _enqueue(base + 8 * n, n, base)
    if status:
        raise _lib.error(status)
    return _int64s(n).unpack_from(buf), buf


def pack(specs):
    """Lays a batch out for perseus_enqueue, drawing names for unnamed requests.

    Returns (buf, n): buf is an array.array of bytes holding, 8-byte aligned,
    [n int64 handles_out][n perseus_request_t at byte 8*n][int64 shapes+splits]
    [names]; the records' name/shape/splits pointers point into buf. A front end
    that enqueues later (perseus.mxnet's engine ops) copies buf and moves them.
    """
    n = len(specs)
    # Shapes and splits of all requests, in order, as one int64 array; names as one
    # NUL-separated string. A single request (the common case) builds no lists.
    if n == 1:
        spec = specs[0]
        ints = spec[5] if spec[12] is None else (*spec[5], *spec[12])
        wires = (spec[0] or _unnamed(spec[1], spec[11]),)
    elif n == 0:
        raise ValueError("enqueue() needs at least one request")
    else:
        ints = []
        wires = []
        for spec in specs:
            ints += spec[5]
            if spec[12] is not None:
                ints += spec[12]
            wires.append(spec[0] or _unnamed(spec[1], spec[11]))
    names = b"\0".join(wires) + b"\0"
    # One zeroed buffer per batch, 8-byte aligned sections:
    #   [n int64 handles_out][n perseus_request_t][int64 shapes+splits][names]
    req_at = 8 * n
    ints_at = req_at + _STRIDE * n
    chars_at = ints_at + 8 * len(ints)
    buf = array.array("B", bytes(chars_at + len(names)))
    base = buf.buffer_info()[0]
    memoryview(buf)[chars_at:] = names
    try:
        if ints:
            _int64s(len(ints)).pack_into(buf, ints_at, *ints)
        rec = req_at
        ip = base + ints_at   # address of this request's shape, then its splits
        cp = base + chars_at  # address of this request's name
        for (name, op_type, reduce_op, dtype, device, shape, inp, out, prescale, postscale,
             root_rank, process_set, splits, anonymous, stream), wire in zip(specs, wires):
            if name is None:
                anonymous = 1
            ndim = len(shape)
            shape_at = ip
            ip += 8 * ndim
            if splits is None:
                splits_at = nsplits = 0
            else:
                nsplits = len(splits)
                splits_at = ip
                ip += 8 * nsplits
            _pack_request(buf, rec, cp, op_type, reduce_op, dtype, device, ndim, shape_at,
                          inp, out, prescale, postscale, root_rank, process_set,
                          splits_at, nsplits, anonymous, stream)
            cp += len(wire) + 1
            rec += _STRIDE
    except struct.error as e:
        # A field out of its C type's range (e.g. a root rank > 2**31).
        raise ValueError("invalid request field: %s" % e) from None
    return buf, n


# ---- handles --------------------------------------------------------------------
# User-visible handle -> (core handles, keepalive, finish, state). A grouped op is
# one user handle (its first core handle) over all its core handles.
_pending = {}

_wait = _lib.perseus_wait
_release = _lib.perseus_release
_poll = _lib.perseus_poll
# Waits are sliced so Ctrl-C is honoured within this many seconds; a completed
# request returns at once, so the slice costs nothing on the latency path.
_WAIT_SLICE_S = 0.5
_TIMEOUT = exceptions.TIMEOUT


def submit(specs, finish, state, drive=False):
    """Enqueues a batch and registers it under one handle (an int).

    finish(state, core_handles) runs in synchronize() once every request has
    completed successfully, before the handles are released (so it may call
    output()); its return value is synchronize()'s. `state` must reference every
    tensor whose memory the requests point at, so it outlives the operation.
    """
    handles, keep = enqueue(specs, drive)
    handle = handles[0]
    _pending[handle] = (handles, keep, finish, state)
    return handle


def poll(handle):
    """True when every request behind `handle` has completed (or failed)."""
    entry = _pending.get(handle)
    if entry is None:
        raise ValueError("unknown or already synchronized handle %r" % (handle,))
    done = ctypes.c_int32()
    ref = ctypes.byref(done)
    for h in entry[0]:
        status = _poll(h, ref)
        if status:
            raise _lib.error(status)
        if not done.value:
            return False
    return True


def _wait_all(handles):
    """Waits for every handle; returns the first failure as an exception, or None."""
    failure = None
    for h in handles:
        status = _wait(h, _WAIT_SLICE_S)
        while status == _TIMEOUT:
            status = _wait(h, _WAIT_SLICE_S)
        if status and failure is None:
            failure = _lib.error(status)
    return failure


def synchronize(handle):
    """Waits for `handle` (GIL released while waiting) and returns its result.

    A failed request raises its exception on this thread. Unknown or already
    synchronized handles return None, as in Horovod.
    """
    entry = _pending.pop(handle, None)
    if entry is None:
        return None
    handles, _, finish, state = entry
    try:
        failure = _wait_all(handles)
    except BaseException:
        # Interrupted (KeyboardInterrupt): the engine may still write into our
        # buffers, so they must stay referenced; the handle stays valid.
        _pending[handle] = entry
        raise
    try:
        if failure is not None:
            raise failure
        return finish(state, handles)
    finally:
        for h in handles:
            _release(h)  # cannot fail for a completed handle; never mask the result


def wait(handle, timeout_s=-1.0):
    """Waits for one core handle (not a submit() handle); raises on failure.

    timeout_s < 0 waits forever; on expiry raises TimeoutError and the request is
    still pending.
    """
    status = _wait(handle, timeout_s)
    if status:
        raise _lib.error(status)


def release(handle):
    """Forgets a completed core handle."""
    _lib.check(_release(handle))


def _free(address):
    _lib.perseus_free_buffer(address)


def output(handle, dtype):
    """The core-allocated output of a completed core handle, without copying.

    Returns (buffer, shape, recv_splits): buffer is a ctypes char array over the
    core's memory (None when the core returned no buffer, e.g. an empty output),
    freed with perseus_free_buffer once the buffer and every view of it (e.g.
    torch.frombuffer) are gone; shape is a tuple; recv_splits is a tuple for
    alltoall, else None. For join, shape[0] is the last rank that joined.
    """
    data = ctypes.c_void_p()
    shape = (ctypes.c_int64 * _lib.PERSEUS_MAX_DIMS)()
    ndim = ctypes.c_int32()
    splits = ctypes.POINTER(ctypes.c_int64)()
    nsplits = ctypes.c_int32()
    status = _lib.perseus_handle_output(handle, ctypes.byref(data), shape, ctypes.byref(ndim),
                                        ctypes.byref(splits), ctypes.byref(nsplits))
    if status:
        raise _lib.error(status)
    dims = tuple(shape[:ndim.value])
    recv = tuple(splits[:nsplits.value]) if splits else None
    address = data.value
    if not address:
        return None, dims, recv
    nbytes = math.prod(dims) * DTYPE_SIZES[dtype]
    buffer = (ctypes.c_char * nbytes).from_address(address)
    # Frees the core's memory when the last reference to `buffer` goes away. Not at
    # interpreter exit: the process is ending, and the library may be gone.
    weakref.finalize(buffer, _free, address).atexit = False
    return buffer, dims, recv


def reset():
    """Forgets names and handles of a previous init(); called by init().

    Every rank restarts its unnamed-request counters together, and handles of an
    earlier session mean nothing to a new engine.
    """
    _counters.clear()
    _pending.clear()
