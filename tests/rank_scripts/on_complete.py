"""perseus_on_complete, the completion callback the native bridges (TF ops, MXNet
engine) use: it runs exactly once per group of handles, after the last one completes
(on a core thread) or at once when all have; it reports the first failure in list
order; an unknown handle is refused; and shutdown still calls it, with SHUT_DOWN.

"Pending" is guaranteed, not hoped for: rank 0 submits only after the others have
registered their callbacks (signalled through files, outside the library).
"""
import ctypes
import threading
import time

import torch

from common import hvd, init, main, touch, wait_for
from perseus.common import exceptions as ex
from perseus.common import library as lib
from perseus.common import builder, ops, requests


class Callback:
    """One perseus_callback_t that records every call."""

    def __init__(self):
        self.calls = []
        self.called = threading.Event()
        self.fn = lib.CALLBACK(self._run)  # kept alive as long as this object

    def _run(self, arg, status, message):
        self.calls.append((status, (message or b"").decode(), threading.get_ident()))
        self.called.set()

    def register(self, handles):
        array = (ctypes.c_int64 * max(1, len(handles)))(*handles)
        return lib.perseus_on_complete(array, len(handles), self.fn, None)

    def once(self, what, timeout_s=60.0):
        """(status, message, thread id) of the one call, waiting for it if need be."""
        assert self.called.wait(timeout_s), "%s: no callback within %.0f s" % (what, timeout_s)
        time.sleep(0.05)  # a second call would come now
        assert len(self.calls) == 1, "%s: called %d times" % (what, len(self.calls))
        return self.calls[0]


def submit(name, tensors):
    """Enqueues one in-place Sum allreduce per tensor, together; returns the handles."""
    specs = [builder.Request(ops.ALLREDUCE, ops.GLOBAL_PROCESS_SET, ops.FLOAT32,
                             tuple(t.shape), t.data_ptr(), t.data_ptr(),
                             name=builder.wire_name(ops.ALLREDUCE, "%s.%d" % (name, i)),
                             reduce_op=ops.Sum)
             for i, t in enumerate(tensors)]
    handles, keep = requests.enqueue(builder.pack(specs))
    submit.keep.append((keep, tensors))
    return list(handles)


submit.keep = []  # buffers (names, shapes, tensors) outlive their requests


def release(handles):
    for h in handles:
        lib.check(lib.perseus_release(h))


def body():
    rank, size = init()
    main_thread = threading.get_ident()
    total = float(size * (size + 1) // 2)

    # Pending at registration: the callback runs once, after both requests, elsewhere.
    tensors = [torch.full((5,), float(rank + 1)), torch.full((3,), float(rank + 1))]
    if rank == 0:
        for r in range(1, size):
            wait_for("registered.%d" % r)
    handles = submit("pending", tensors)
    cb = Callback()
    lib.check(cb.register(handles))
    if rank != 0:
        assert not cb.calls, "called before rank 0 submitted: %s" % cb.calls
        touch("registered.%d" % rank)
    status, message, thread = cb.once("pending group")
    assert status == ex.SUCCESS and message == "", (status, message)
    if rank != 0:
        assert thread != main_thread, "a pending group's callback ran on the registering thread"
    for t in tensors:
        assert torch.equal(t, torch.full(t.shape, total)), t
    release(handles)

    # Complete already: called on this thread before perseus_on_complete returns.
    tensors = [torch.full((4,), float(rank + 1))]
    handles = submit("done", tensors)
    for h in handles:
        lib.check(lib.perseus_wait(h, -1.0))
    cb = Callback()
    lib.check(cb.register(handles))
    assert len(cb.calls) == 1 and cb.calls[0][:2] == (ex.SUCCESS, ""), cb.calls
    assert cb.calls[0][2] == main_thread
    release(handles)

    # No handles: at once.
    cb = Callback()
    lib.check(cb.register([]))
    assert cb.calls and cb.calls[0][0] == ex.SUCCESS, cb.calls

    # An unknown handle (alone or among good ones) is refused, and nothing is called.
    tensors = [torch.ones(2)]
    good = submit("unknown", tensors)
    for handles in ([10 ** 12], good + [10 ** 12]):
        cb = Callback()
        status = cb.register(handles)
        assert status == ex.INVALID_ARGUMENT, status
        assert "unknown" in lib.perseus_last_error().decode(), lib.perseus_last_error()
    lib.check(lib.perseus_wait(good[0], -1.0))
    time.sleep(0.05)
    assert not cb.calls, cb.calls
    release(good)

    # The first failure in list order is reported: a mismatched shape after a good one.
    ok = submit("first_ok", [torch.ones(2)])
    bad = submit("mismatch", [torch.ones(2 + (rank == 0))])
    cb = Callback()
    lib.check(cb.register(ok + bad))
    status, message, _ = cb.once("failed group")
    assert status == ex.MISMATCH and "mismatch.0" in message, (status, message)
    release(ok + bad)

    # Shutdown cancels a request only rank 0 submitted: its callback hears SHUT_DOWN.
    cb = Callback()
    if rank == 0:
        orphan = submit("orphan", [torch.ones(2)])
        lib.check(cb.register(orphan))
        touch("orphan.registered")
    else:
        wait_for("orphan.registered")
    hvd.shutdown()
    if rank == 0:
        status, message, _ = cb.once("shutdown")
        assert status == ex.SHUT_DOWN, (status, message)


if __name__ == "__main__":
    main(body)
