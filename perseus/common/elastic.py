"""Horovod's elastic API (hvd.elastic) on MPI's fixed world: state objects that
commit, restore and sync, and run(), which retries a training function after a
HorovodInternalError.

What is the same as Horovod: State / ObjectState and their methods, reset
callbacks, and run()'s loop (sync, call; on HorovodInternalError restore the last
commit, reset, fire the callbacks, sync again, call again).

What differs: Perseus runs on the ranks mpirun started and no driver ever adds
ranks, so there is no re-rendezvous. A rank that fails is left behind when the job
can outlive it (Open MPI 5's ULFM, `mpirun --with-ft ulfm`): the survivors' world
shrinks in place at the reset (reset()), else the failure ends the job as MPI's does.
commit() never finds host updates (and so costs no collective), and a
HostsUpdatedInterrupt (a resize request) ends run() with an error saying what
elastic resizing needs. The framework modules
(perseus.torch.elastic, perseus.tensorflow.elastic) add their states and run().
"""

import functools
import sys

from perseus.common import basics
from perseus.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

RESIZE_UNSUPPORTED = (
    "elastic resizing (adding or removing workers) needs Horovod's elastic driver "
    "(horovodrun --min-np/--max-np with a host discovery script); Perseus runs on MPI's "
    "fixed world of ranks started by mpirun, so hvd.elastic.run only retries after a "
    "HorovodInternalError, on the same %d ranks")


class State:
    """State kept in memory on every worker: commit() saves it, restore() rolls back
    to the last commit, sync() makes every rank hold rank 0's.

    bcast_object(obj) -> rank 0's obj; get_rank() -> this rank. Subclasses
    implement save, restore, sync and reset.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called (no arguments) after every reset, e.g. to rescale the
        learning rate or rebuild a data loader."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res):
        """Called by Horovod's driver on a host change; there is none here."""
        raise NotImplementedError(RESIZE_UNSUPPORTED % basics.size())

    def commit(self):
        """Saves the state (the next restore() returns to it) and checks for host
        updates. Saving copies every tracked value: commit every few batches, not
        after each."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Would raise HostsUpdatedInterrupt when hosts were added or removed. The
        world is fixed, so there is never an update (and no collective is needed
        to agree on that)."""

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """Called after a reset, before the callbacks; nothing to do by default."""


class ObjectState(State):
    """State made of picklable Python objects, given as keyword arguments and
    exposed as attributes (state.epoch, state.batch, ...). sync() broadcasts the
    last committed values from rank 0."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


def reset():
    """What follows a failure before the next attempt. Horovod shuts down and
    re-initialises to join a new world. Here, when a rank of the world failed (a
    fault-tolerant job: basics.fault_tolerance()), shutdown() and init() form the world
    of the survivors in place (ranks and sizes change; process sets other than the
    global one are gone: register them again in a reset callback). After any other
    HorovodInternalError the world is the same, and the engine, which reports a
    collective's failure on every rank and goes on, is kept; only an engine that was
    shut down is started again."""
    if basics.is_initialized() and basics.world_failed():
        basics.shutdown()
    if not basics.is_initialized():
        basics.init()


_said_mode = False


def _say_mode():
    """Once per process, on rank 0: whether a lost rank is recovered in place or ends
    the job, and why (issue 46: the mode is stated when the job starts)."""
    global _said_mode
    if _said_mode:
        return
    _said_mode = True
    enabled, why = basics.fault_tolerance()
    if basics.rank() == 0:
        sys.stderr.write("[perseus] hvd.elastic: %s: %s\n" % (
            "a rank that fails is left behind and training goes on with the others"
            if enabled else "a rank that fails ends the job", why))


def run_fn(func, reset_fn=reset):
    """Decorates func(state, *args, **kwargs): syncs `state` from rank 0, then
    calls func; after a HorovodInternalError (in either) restores the last commit,
    resets, fires the reset callbacks and tries again. Returns func's result."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        _say_mode()
        while True:
            try:
                # Inside: a rank that fails during the sync after a failure is one more.
                state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
            except HostsUpdatedInterrupt as e:
                raise NotImplementedError(RESIZE_UNSUPPORTED % basics.size()) from e
            reset_fn()
            state.on_reset()

    return wrapper
