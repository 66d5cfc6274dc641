"""Request submission: enqueue, handles, outputs.

Front ends build Request objects (perseus.common.builder), pack a whole batch
(builder.pack, or builder.pack_prebuilt for requests packed before) and hand it to
submit(): a grouped op or a list of tensors becomes ONE perseus_enqueue call, so
the core negotiates it as one unit. The handle table lives here too, so no front
end re-implements it.
"""

import array
import ctypes
import math
import time
import weakref

from perseus.common import builder as _builder
from perseus.common import exceptions
from perseus.common import library as _lib
from perseus.common.ops import DTYPE_SIZES

# How long a caller that waits at once runs the engine itself before leaving the
# rest to the engine thread (and to sliced waits, so Ctrl-C is honoured).
DRIVE_S = 0.5
# enqueue()'s `drive` for a caller that waits soon, not at once.
SOON = "soon"


def enqueue(packed, drive=False):
    """Submits a batch packed by builder.pack() or builder.pack_prebuilt(), (buf, n),
    in one perseus_enqueue call.

    drive=True is for a caller that waits at once: this thread then runs the engine
    until the requests complete, so no thread hand-off is on the latency path.
    drive=SOON, for one that waits soon (before anything else of its own needs
    them), e.g. after submitting a few more: the engine thread is not woken, and the
    wait drives them (perseus_enqueue_deferred).

    Returns (handles, buf): the core handles (a tuple, one per request) and the
    buffer that holds the names, shapes and splits the core may read until every
    handle completes. The caller keeps `buf` (and the tensors behind the
    input/output addresses) alive until then; submit() does this for you.
    """
    buf, n = packed
    base = buf.buffer_info()[0]
    if drive is True:
        status = _lib.perseus_enqueue_and_drive(base + 8 * n, n, base, DRIVE_S)
    elif drive:
        status = _lib.perseus_enqueue_deferred(base + 8 * n, n, base)
    else:
        status = _lib.perseus_enqueue(base + 8 * n, n, base)
    if status:
        raise _lib.error(status)
    return _builder.int64s(n).unpack_from(buf), buf


# ---- handles --------------------------------------------------------------------
# User-visible handle -> (core handles, keepalive, finish, state). A grouped op is
# one user handle (its first core handle) over all its core handles.
_pending = {}

# Waits are sliced so Ctrl-C is honoured within this many seconds; a completed
# request returns at once, so the slice costs nothing on the latency path.
_WAIT_SLICE_S = 0.5


def submit(packed, finish, state, drive=False, consumer_stream=None):
    """Enqueues a packed batch (see enqueue()) and registers it under one handle (an
    int).

    finish(state, core_handles) runs in synchronize() once every request has
    completed successfully, before the handles are released (so it may call
    output()); its return value is synchronize()'s. `state` must reference every
    tensor whose memory the requests point at, so it outlives the operation.

    consumer_stream: None for a batch of CPU requests; for one with GPU requests, a
    callable returning the stream (an int handle) that will use the results: at
    synchronize() it is made to wait for the device work (perseus_stream_wait)
    before finish runs, failed requests included, since their inputs may still be
    read on the device.
    """
    return _register(enqueue(packed, drive), finish, state, consumer_stream)


def run(packed, finish, state, bound=None, failed=None):
    """submit() and synchronize() at once, for a caller that waits at once and reads
    no core-allocated output (a repeated in-place call): one call into the core
    (perseus_run), which also releases the handles. Returns finish(state, ()), or
    raises the request's error. Still pending after a wait slice (Ctrl-C is honoured
    between slices): registered as submit() does, and synchronized.

    bound: None, or (deadline, reason): settle_by()'s, every rank must have submitted
    the requests by time.monotonic() `deadline` (a torch process group's timeout).
    failed: None raises the error of a request that failed; else run returns
    failed(error), for a caller that reports it later (a torch Work). A request the
    core refused to enqueue raises either way: it was never submitted."""
    buf, n = packed
    base = buf.buffer_info()[0]
    wait_s = _WAIT_SLICE_S
    if bound is not None:
        wait_s = min(wait_s, max(0.0, bound[0] - time.monotonic()))
    status = _lib.perseus_run(base + 8 * n, n, base, wait_s)
    if status == 0:
        return finish(state, ())
    if status != exceptions.TIMEOUT:
        error = _lib.error(status)
        # perseus_run writes the handles only once the requests are enqueued.
        if failed is None or not _builder.int64s(1).unpack_from(buf)[0]:
            raise error
        return failed(error)
    return settled(_register((_builder.int64s(n).unpack_from(buf), buf), finish, state, None),
                   bound, failed)


def settled(handle, bound=None, failed=None):
    """synchronize(handle) within `bound` and reporting to `failed`, as run() does."""
    try:
        if bound is not None:
            settle_by(handle, bound[0], bound[1])
        return synchronize(handle)
    except Exception as error:  # KeyboardInterrupt leaves the handle pending
        if failed is None:
            raise
        return failed(error)


def point_to_point(recv, address, nbytes, peer, tag, process_set_id, keep, device=-1,
                   stream=None, consumer_stream=None):
    """Posts one point-to-point message (perseus_point_to_point): `nbytes` at
    `address`, to or (recv) from set rank `peer` (recv: -1 for any) with `tag`. `keep`
    references the memory until the message completes. Device memory: `device` (>= 0)
    holds it, ready on `stream`; consumer_stream as for submit(). Registered like
    submit()'s requests; synchronize() returns the peer's set rank (a receive's
    source)."""
    message = _lib.P2P(1 if recv else 0, address, nbytes, peer, tag, process_set_id, device,
                       stream)
    handle = ctypes.c_int64()
    _lib.check(_lib.perseus_point_to_point(ctypes.byref(message), ctypes.byref(handle)))
    return _register(((handle.value,), None), _finish_source, keep, consumer_stream)


def _finish_source(state, handles):
    return output_address(handles[0])[1][0]


def counters():
    """What the core has asked of MPI in this process so far, by name
    (library.COUNTER_NAMES: negotiation rounds and gathers, rounds that carried a
    request's data and the requests they completed, the lanes' collectives)."""
    values = (ctypes.c_int64 * len(_lib.COUNTER_NAMES))()
    _lib.check(_lib.perseus_counters(values, len(values)))
    return dict(zip(_lib.COUNTER_NAMES, values))


def _register(enqueued, finish, state, consumer_stream):
    handles, keep = enqueued
    handle = handles[0]
    _pending[handle] = (handles, keep, finish, state, consumer_stream)
    return handle


def _unknown(handle):
    return ValueError("unknown or already synchronized handle %r (handles are valid from the "
                      "call that returned them until synchronize(), within one init())"
                      % (handle,))


def poll(handle):
    """True when every request behind `handle` has completed (or failed)."""
    entry = _pending.get(handle)
    if entry is None:
        raise _unknown(handle)
    done = ctypes.c_int32()
    ref = ctypes.byref(done)
    for h in entry[0]:
        status = _lib.perseus_poll(h, ref)
        if status:
            raise _lib.error(status)
        if not done.value:
            return False
    return True


def settle(handle):
    """Blocks until every request behind `handle` has completed (or failed), without
    finishing it: synchronize() still returns its result or raises its error. Returns
    at once for a handle synchronized already (also by another thread meanwhile)."""
    entry = _pending.get(handle)
    if entry is not None:
        _wait_all(entry[0])  # a released handle's wait fails at once: fine here


def settle_by(handle, deadline, reason):
    """settle(), giving up at time.monotonic() `deadline` on the requests behind
    `handle` that not every rank has submitted by then: the core withdraws them
    (perseus_withdraw), and synchronize() then raises their error, which names the
    ranks that had not submitted them and ends with `reason`. Requests every rank
    has submitted complete as usual."""
    entry = _pending.get(handle)
    if entry is None:
        return
    reason = reason.encode()
    done = ctypes.c_int32()
    for h in entry[0]:
        status = exceptions.TIMEOUT
        while status == exceptions.TIMEOUT:
            left = deadline - time.monotonic()
            if left <= 0:
                _lib.perseus_poll(h, ctypes.byref(done))
                if not done.value:
                    _lib.perseus_withdraw(h, reason)
                break
            status = _lib.perseus_wait(h, min(left, _WAIT_SLICE_S))
    _wait_all(entry[0])


def probe_within(process_set_id, seconds):
    """Has this rank answer its peers in the set within about `seconds` even when it
    has nothing to do (perseus_process_set_probe), so a peer that gives up on a
    request (settle_by) learns soon who lacks it."""
    _lib.check(_lib.perseus_process_set_probe(process_set_id, seconds))


def _wait_all(handles):
    """Waits for every handle; returns the first failure as an exception, or None."""
    failure = None
    for h in handles:
        status = _lib.perseus_wait(h, _WAIT_SLICE_S)
        while status == exceptions.TIMEOUT:
            status = _lib.perseus_wait(h, _WAIT_SLICE_S)
        if status and failure is None:
            failure = _lib.error(status)
    return failure


def synchronize(handle):
    """Waits for `handle` (GIL released while waiting) and returns its result.

    A failed request raises its exception on this thread. An unknown, already
    synchronized or pre-init() handle raises ValueError, as poll() does (Horovod
    returns None there, which hides the bug of waiting on the wrong handle).
    """
    entry = _pending.pop(handle, None)
    if entry is None:
        raise _unknown(handle)
    try:
        failure = _wait_all(entry[0])
    except BaseException:
        # Interrupted (KeyboardInterrupt): the engine may still write into our
        # buffers, so they must stay referenced; the handle stays valid.
        _pending[handle] = entry
        raise
    try:
        return _complete(entry, failure)
    finally:
        entry = None  # see _complete


def _complete(entry, failure, stream_waited=False):
    """The rest of synchronize() once every request of `entry` has completed:
    raises `failure` (or a GPU stream wait's), else returns finish's result; releases
    the core handles either way. stream_waited: the consumer stream has waited for
    the GPU requests already (synchronize_all waits for all at once)."""
    handles, _, finish, state, consumer_stream = entry
    try:
        if consumer_stream is not None and not stream_waited:  # GPU requests
            stream_failure = _stream_wait_all(handles, consumer_stream())
            failure = failure or stream_failure
        if failure is not None:
            raise failure
        return finish(state, handles)
    finally:
        for h in handles:
            _lib.perseus_release(h)  # cannot fail for a completed handle; never mask the result
        # A raised failure's traceback keeps this frame alive (until the caller lets
        # the exception go, or longer through `failure`'s cycle): let the state go
        # now, with whatever it holds (e.g. torch's pinned storages, see keepalive.py).
        entry = state = None


def synchronize_all(handles):
    """[synchronize(h) for h in handles], waiting for all their requests with one
    call into the core (a training step's gradients: one wait, not one per tensor).

    Errors as the loop would have them: the first failure in list order is raised
    (the same exception synchronize() of that handle raises); the handles before it
    are finished and released, those after it stay pending (valid, their buffers
    referenced), as the loop would leave them. Any unknown handle raises ValueError
    before anything is waited for.
    """
    entries = []
    seen = set()
    for handle in handles:
        entry = _pending.get(handle)
        if entry is None or handle in seen:
            raise _unknown(handle)
        seen.add(handle)
        entries.append((handle, entry))
    core = array.array("q")
    for _, entry in entries:
        core.extend(entry[0])
    index = ctypes.c_int32(-1)
    ref = ctypes.byref(index)
    address = core.buffer_info()[0]
    status = _lib.perseus_wait_all(address, len(core), _WAIT_SLICE_S, ref)
    while status == exceptions.TIMEOUT:  # sliced so Ctrl-C is honoured; the handles stay valid
        status = _lib.perseus_wait_all(address, len(core), _WAIT_SLICE_S, ref)
    failure = _lib.error(status) if status else None
    failed_at = index.value if failure is not None else len(core)
    if failure is not None and failed_at < 0:
        raise failure  # not a request's failure (bad arguments): nothing consumed
    stream_failure = _stream_wait_entries(entries, failed_at)
    results = []
    start = 0  # index in `core` of the first request of `entry`
    for k, (handle, entry) in enumerate(entries):
        del _pending[handle]
        count = len(entry[0])
        try:
            if start + count <= failed_at:
                gpu_failure = stream_failure if entry[4] is not None else None
                results.append(_complete(entry, gpu_failure, stream_waited=True))
            else:
                # The failed request's batch: its later requests are waited for as
                # synchronize() waits for a whole batch.
                _wait_all(entry[0][failed_at - start + 1:])
                _complete(entry, failure)
        except BaseException:
            for later, later_entry in entries[k + 1:]:
                _pending[later] = later_entry
            later_entry = None
            entries.clear()  # the traceback keeps this frame: let the states go
            raise
        finally:
            entry = None  # see _complete
        start += count
    return results


def _stream_wait_all(handles, stream):
    """Makes `stream` wait on the device for every handle's device work (no host
    wait; a no-op for CPU handles): one wait per batch the handles ran in. Returns
    the first failure, or None."""
    if len(handles) == 1:
        status = _lib.perseus_stream_wait(handles[0], stream)
    else:
        core = array.array("q", handles)
        status = _lib.perseus_stream_wait_all(core.buffer_info()[0], len(core), stream)
    return _lib.error(status) if status else None


def _stream_wait_entries(entries, failed_at):
    """synchronize_all's stream waits for the GPU entries that completed before the
    failure at index `failed_at` of the flattened handles: one call per consumer
    stream. Returns the first failure, or None."""
    by_stream = {}
    start = 0
    for _, entry in entries:
        count = len(entry[0])
        if entry[4] is not None and start + count <= failed_at:
            by_stream.setdefault(entry[4](), []).extend(entry[0])
        start += count
    failure = None
    for stream, handles in by_stream.items():
        failure = failure or _stream_wait_all(handles, stream)
    return failure


def wait(handle, timeout_s=-1.0):
    """Waits for one core handle (not a submit() handle); raises on failure.

    timeout_s < 0 waits forever; on expiry raises TimeoutError and the request is
    still pending.
    """
    status = _lib.perseus_wait(handle, timeout_s)
    if status:
        raise _lib.error(status)


def release(handle):
    """Forgets a completed core handle."""
    _lib.check(_lib.perseus_release(handle))


def _free(address):
    _lib.perseus_free_buffer(address)


def free_device_buffer(address, stream):
    """Frees a core-allocated device output (from output_address() of a GPU request)
    stream-ordered on `stream`, which must have waited for the request."""
    _lib.check(_lib.perseus_free_device_buffer(address, stream))


def output_address(handle):
    """(address, shape, recv_splits) of a completed core handle's core-allocated
    output; address is an int, 0 when the core returned no buffer. The caller owns
    the memory: perseus_free_buffer for a CPU request (output() does it),
    free_device_buffer() for a GPU request."""
    data = ctypes.c_void_p()
    shape = (ctypes.c_int64 * _lib.PERSEUS_MAX_DIMS)()
    ndim = ctypes.c_int32()
    splits = ctypes.POINTER(ctypes.c_int64)()
    nsplits = ctypes.c_int32()
    status = _lib.perseus_handle_output(handle, ctypes.byref(data), shape, ctypes.byref(ndim),
                                        ctypes.byref(splits), ctypes.byref(nsplits))
    if status:
        raise _lib.error(status)
    recv = tuple(splits[:nsplits.value]) if splits else None
    return data.value or 0, tuple(shape[:ndim.value]), recv


def output(handle, dtype):
    """The core-allocated output of a completed core handle, without copying.

    Returns (buffer, shape, recv_splits): buffer is a ctypes char array over the
    core's memory (None when the core returned no buffer, e.g. an empty output),
    freed with perseus_free_buffer once the buffer and every view of it (e.g.
    torch.frombuffer) are gone; shape is a tuple; recv_splits is a tuple for
    alltoall, else None. For join, shape[0] is the last rank that joined.
    """
    address, dims, recv = output_address(handle)
    if not address:
        return None, dims, recv
    nbytes = math.prod(dims) * DTYPE_SIZES[dtype]
    buffer = (ctypes.c_char * nbytes).from_address(address)
    # Frees the core's memory when the last reference to `buffer` goes away. Not at
    # interpreter exit: the process is ending, and the library may be gone.
    weakref.finalize(buffer, _free, address).atexit = False
    return buffer, dims, recv


def reset():
    """Forgets the handles of a previous init(), which mean nothing to a new engine;
    called by init()."""
    _pending.clear()
