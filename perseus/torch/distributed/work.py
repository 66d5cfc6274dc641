"""Work: what a collective called with async_op=True returns, as in torch.

A Work wraps one Perseus handle. wait() synchronizes it (the GIL is released while
waiting) and then runs the call's `finish` step, e.g. copying an allgather's rows
into the caller's tensor list. is_completed() polls without blocking.

get_future() returns a torch.futures.Future completed with the output tensors. The
core has no completion callbacks, so one daemon thread (started on first use) waits
on the works whose futures were asked for, in submission order, and completes the
futures; their then() callbacks run on that thread, as they run on torch's
communication thread. Works nobody asks a future of never touch that thread.

CUDA outputs: wait() makes the caller's current stream wait for the collective (as
torch's). That thread has its own current stream, so it synchronizes, and runs the
callbacks, on the stream that was current where the Work was made.
"""

import contextlib
import queue
import threading
import time

import torch

from perseus.common import requests as _requests


class Work:
    """One asynchronous collective. `finish()` (optional) runs once the handle has
    completed and returns the output tensors (what result() and the future give)."""

    def __init__(self, handle, outputs, finish=None):
        self._handle = handle
        self._outputs = outputs
        self._finish = finish
        self._lock = threading.Lock()
        self._done = False
        self._error = None
        self._future = None
        self._stream = _creator_stream(outputs)

    @classmethod
    def completed(cls, outputs):
        """A Work for an operation that already ran to completion (e.g. barrier)."""
        work = cls(None, outputs)
        work._done = True
        return work

    def _complete(self):
        """Synchronizes once (CUDA: the current stream waits); the outcome (outputs or
        error) is kept for later calls."""
        with self._lock:
            if self._done:
                return
            try:
                value = _requests.synchronize(self._handle)
                if self._finish is not None:
                    self._finish(value)
            except Exception as e:  # KeyboardInterrupt leaves the handle pending
                self._error = e
            self._done = True

    def wait(self, timeout=None):
        """Blocks until the collective is done; raises its error. Returns True.

        timeout (a datetime.timedelta or seconds): raise TimeoutError when the
        collective has not completed by then; it stays pending.
        """
        if timeout is not None and not self._done:
            seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
            deadline = time.monotonic() + float(seconds)
            while not self.is_completed():
                if time.monotonic() >= deadline:
                    raise TimeoutError("collective did not complete within %s" % (timeout,))
                time.sleep(0.0005)
        self._complete()
        if self._error is not None:
            raise self._error
        return True

    synchronize = wait

    def is_completed(self):
        """True once the collective has finished (successfully or not)."""
        if self._done:
            return True
        if not self._lock.acquire(blocking=False):
            return False  # another thread is waiting on it right now
        try:
            return self._done or _requests.poll(self._handle)
        finally:
            self._lock.release()

    def is_success(self):
        return self._done and self._error is None

    def exception(self):
        return self._error

    def result(self):
        """The output tensors (a list), after waiting."""
        self.wait()
        return self._outputs

    def get_future(self):
        """A torch.futures.Future completed with result() (or the error)."""
        if self._future is None:
            self._future = torch.futures.Future()
            if self._done:
                _settle(self)
            else:
                _completer().put(self)
        return self._future


def _creator_stream(outputs):
    """The current stream of the first CUDA output's device, or None."""
    for t in outputs if isinstance(outputs, (list, tuple)) else (outputs,):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return torch.cuda.current_stream(t.device)
    return None


def _on_creator_stream(work):
    return (contextlib.nullcontext() if work._stream is None
            else torch.cuda.stream(work._stream))


def _settle(work):
    if work._error is not None:
        work._future.set_exception(work._error)
    else:
        work._future.set_result(work._outputs)


_queue = None
_queue_lock = threading.Lock()


def _completer():
    """The queue of the thread that completes futures, started on first use."""
    global _queue
    with _queue_lock:
        if _queue is None:
            _queue = queue.SimpleQueue()
            threading.Thread(target=_complete_futures, args=(_queue,), daemon=True,
                             name="perseus-futures").start()
        return _queue


def _complete_futures(pending):
    while True:
        work = pending.get()
        with _on_creator_stream(work):
            work._complete()
            try:
                _settle(work)
            except Exception:
                pass  # a then() callback's failure is already recorded in its own future
