"""Work: what a collective called with async_op=True returns, as in torch.

A Work wraps one Perseus handle. wait() synchronizes it (the GIL is released while
waiting, and the waiting thread drives the engine) and then runs the call's `finish`
step, e.g. copying an allgather's rows into the caller's tensor list. is_completed()
polls without blocking. It is a torch.distributed.Work, so the "perseus" backend
(backend.py) hands it to torch's C++ code (DDP's reducer) as it is.

get_future() returns a torch.futures.Future completed with the output tensors.

CPU outputs: get_future() waits for the collective, as wait() does, and returns the
future complete; then() callbacks run at once on the caller's thread. On the CPU the
collective needs the cores the caller computes on: a thread that waits beside it, and
drives MPI, only competes with that computation (torch's DDP over "perseus" on 2
cores took 5-15 % longer per step so on ddp_bench's many_small, up to 45 % on large:
benchmarks/README.md, issue 38). Safe
where every rank submits collectives in the same order, as torch.distributed
requires; Work(background=True) is for a caller that does not.

CUDA outputs (and background works): the handle completes once the device work is
queued, so waiting for it means waiting for the peers, which the caller should not.
Threads of a small pool (started on first use) wait on those works, in submission
order, blocked in the core (no polling), and complete the futures; their then()
callbacks run on that thread, as on torch's communication threads. A callback may
itself wait for a later collective (PowerSGD's hook does), so before a thread runs
callbacks it makes sure another is free to complete that one. wait() makes the
caller's current stream wait for the collective (as torch's); a pool thread
synchronizes, and completes the future, on the stream that was current where the
Work was made, and the future, made for the outputs' devices, records its event
there: whoever uses the result (a callback, DDP's reducer) waits on the device,
never the host.
"""

import contextlib
import os
import queue
import threading
import time

import torch
import torch.distributed as _torch_dist

from perseus.common import requests as _requests
from perseus.common.exceptions import WaitTimeoutError


class Work(_torch_dist.Work):
    """One asynchronous collective. `finish()` (optional) runs once the handle has
    completed; result() and the future give `outputs`. background=True: a CPU work's
    future is completed by the pool too, for a caller whose peers may submit their
    collectives in another order (the drop-in DDP's reducer), where waiting for one
    in get_future() could wait for a peer that waits for another."""

    def __init__(self, handle, outputs, finish=None, background=False, done=False):
        super().__init__()
        self._handle = handle
        self._outputs = outputs
        self._finish = finish
        self._background = background
        self._done = done
        self._error = None
        self._future = None
        self._source = None  # what _settle completes: the future itself, or its source
        # time.monotonic() by which every rank must have submitted the collective, and
        # what the error says then (a process group's timeout; backend.py sets them).
        self._deadline = self._deadline_reason = None
        if done:  # CPU outputs (see completed()): no stream, and no lock to take
            self._stream = None
            return
        self._lock = threading.Lock()
        self._stream = _creator_stream(outputs)

    @classmethod
    def completed(cls, outputs):
        """A Work for an operation on CPU tensors that already ran to completion (e.g.
        a collective the caller's thread ran: torch_api's `now`); failed() records its
        error, if it failed, for wait() and the future to raise."""
        return cls(None, outputs, done=True)

    def failed(self, error):
        """The collective failed with `error` (requests.run's `failed`): returns the
        Work."""
        self._error = error
        return self

    def _complete(self):
        """Synchronizes once (CUDA: the current stream waits); the outcome (outputs or
        error) is kept for later calls."""
        if self._done:  # set last, once the outcome is kept: no lock needed to read it
            return
        with self._lock:
            if self._done:
                return
            try:
                if self._deadline is not None:
                    _requests.settle_by(self._handle, self._deadline, self._deadline_reason)
                value = _requests.synchronize(self._handle)
                if self._finish is not None:
                    self._finish(value)
            except Exception as e:  # KeyboardInterrupt leaves the handle pending
                self._error = e
            self._done = True

    def wait(self, timeout=None):
        """Blocks until the collective is done; raises its error. Returns True.

        timeout (a datetime.timedelta or seconds; 0 or None: none, as torch's
        default): raise WaitTimeoutError (a TimeoutError and a RuntimeError, as
        gloo's) when the collective has not completed by then; it stays pending.
        """
        if not self._done:
            seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
            if seconds:
                deadline = time.monotonic() + float(seconds)
                while not self.is_completed():
                    if time.monotonic() >= deadline:
                        raise WaitTimeoutError("collective did not complete within %s"
                                               % (timeout,))
                    time.sleep(0.0005)
            self._complete()
        if self._error is not None:
            raise self._error
        return True

    def synchronize(self):
        self.wait()

    def is_completed(self):
        """True once the collective has finished (successfully or not) and its outputs
        are in place, as torch's: a script may read them without wait()."""
        if self._done:
            return True
        if not self._lock.acquire(blocking=False):
            return False  # another thread is waiting on it right now
        try:
            if not (self._done or _requests.poll(self._handle)):
                return False
        finally:
            self._lock.release()
        self._complete()  # the finish step (copies into the caller's tensors), at once
        return True

    def _source_rank(self):
        """A receive's sender, its rank in the group (torch's recv from any rank asks)."""
        self.wait()
        if not hasattr(self, "source"):
            raise RuntimeError("_source_rank: this Work is not a receive")
        return self.source

    def is_success(self):
        return self._done and self._error is None

    def exception(self):
        return self._error

    def result(self):
        """The output tensors (a list), after waiting."""
        self.wait()
        return self._outputs

    def get_future(self):
        """A torch.futures.Future completed with result() (or the error). For CPU
        outputs it is complete when returned (see the module's docstring)."""
        if self._future is None:
            if self._stream is None:
                if not self._background:
                    self._complete()
                if self._done and self._error is None:  # the common case: no step between
                    future = self._future = self._source = torch.futures.Future()
                    future.set_result(self._outputs)  # no callbacks yet: it cannot fail
                    return future
            self._source = torch.futures.Future(devices=_devices(self._outputs))
            if self._done and self._error is None:
                self._future = self._source  # no step in between
                _settle(self)
            else:
                self._future = self._source.then(_value_or_raise)
                if self._done:
                    _settle(self)
                else:
                    _pool().put(self)
        return self._future


def _tensors(outputs):
    return outputs if isinstance(outputs, (list, tuple)) else (outputs,)


def _creator_stream(outputs):
    """The current stream of the first CUDA output's device, or None."""
    for t in _tensors(outputs):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return torch.cuda.current_stream(t.device)
    return None


def _devices(outputs):
    """The CUDA devices of the outputs (a future holding CUDA tensors must name them)."""
    devices = {t.device for t in _tensors(outputs) if isinstance(t, torch.Tensor) and t.is_cuda}
    return sorted(devices, key=lambda d: d.index) or None


def _on_creator_stream(work):
    return (contextlib.nullcontext() if work._stream is None
            else torch.cuda.stream(work._stream))


def _settle(work):
    try:
        if work._error is not None:
            work._source.set_exception(work._error)
        else:
            work._source.set_result(work._outputs)
    except Exception:
        pass  # a then() callback's failure is already recorded in its own future


def _value_or_raise(source):
    """The source future's value, or its error raised. A Python future's
    set_exception() keeps the error as its value, which torch's C++ code (DDP's
    reducer) would read as the result and crash on; an error raised in a then()
    callback is a C++ error, which its wait() and value() throw."""
    return source.value()


class _Pool:
    """Threads that complete futures: each takes the next work, waits for it (in the
    core, GIL released), then settles its future, running its callbacks. A thread
    about to run callbacks first starts another when none is free, since a callback
    may wait for a collective queued behind it."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._free = 0  # threads waiting for a work
        self._threads = 0

    def put(self, work):
        with self._lock:
            if self._threads == 0:
                self._start()
        self._queue.put(work)

    def _start(self):  # with _lock held
        self._threads += 1
        threading.Thread(target=self._run, daemon=True,
                         name="perseus-futures-%d" % self._threads).start()

    def _run(self):
        while True:
            with self._lock:
                self._free += 1
            work = self._queue.get()
            with self._lock:
                self._free -= 1
            with _on_creator_stream(work):
                work._complete()
                with self._lock:
                    if self._free == 0:
                        self._start()
                _settle(work)
            work = None


_the_pool = None
_pool_lock = threading.Lock()


def _pool():
    """The pool, started on first use (and anew in a forked child)."""
    global _the_pool
    if _the_pool is None:
        with _pool_lock:
            if _the_pool is None:
                _the_pool = _Pool()
    return _the_pool


def _forget_pool():
    global _the_pool
    _the_pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)
