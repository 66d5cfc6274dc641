"""Errors raised by Perseus, and the table that turns a core status into one.

The status values mirror perseus_status_t in csrc/include/perseus/perseus.h. They
live here, next to the exception each becomes, because errors are the only thing
Python does with them. library.check() is the one caller of exception_for().
"""

# perseus_status_t (perseus.h). Keep in sync with the header.
SUCCESS = 0
INVALID_ARGUMENT = 1
NOT_INITIALIZED = 2
MISMATCH = 3
SHUT_DOWN = 4
MPI_ERROR = 5
CONFIG_ERROR = 6
UNSUPPORTED = 7
TIMEOUT = 8
INTERNAL_ERROR = 9
NON_FINITE = 10
WITHDRAWN = 11
RANK_FAILED = 12


class HorovodInternalError(RuntimeError):
    """A collective failed inside the engine: ranks disagreed on a request, the
    engine shut down under it, MPI failed, or the core hit an internal error.

    Same name as Horovod's so that ``except hvd.HorovodInternalError`` (used by
    elastic-training scripts) keeps working.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal that workers were added or removed (elastic training).
    Perseus' world is fixed, so hvd.elastic.run turns it into an error saying so;
    defined for scripts that name it. skip_sync: as Horovod's."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class WaitTimeoutError(TimeoutError, RuntimeError):
    """A torch Work's wait(timeout) ran out before the collective completed (it stays
    pending). A TimeoutError, and a RuntimeError as gloo's "Operation timed out!", so
    a script's ``except RuntimeError`` catches it as it does on gloo."""


class CollectiveArgumentError(ValueError, RuntimeError):
    """A collective's arguments are invalid (a scalar where dim 0 is split, alltoall
    splits that do not fit the tensor or the set, a first dimension an even alltoall
    cannot split). Raised where the rank finds it, before anything is sent.

    A ValueError, as Perseus reports bad arguments; also a RuntimeError because
    Horovod reports these from its core (MXNetError, torch's RuntimeError), so a
    Horovod script's ``except (MXNetError, RuntimeError)`` still catches it.
    """


class CollectiveTypeError(TypeError, CollectiveArgumentError):
    """An argument of the wrong type where Horovod takes an integer: a float or a
    string as a root rank, a process set's rank or an alltoall split (ops.integer()).
    Raised before anything is sent, instead of truncating the value.

    A TypeError, as Python reports a wrong type; also a CollectiveArgumentError,
    because Horovod reports some of these as ValueError (a ProcessSet's ranks) or from
    its core (float splits), so Horovod scripts' except clauses still catch it.
    """


# Status -> exception class. One table, one place.
_EXCEPTION_FOR_STATUS = {
    INVALID_ARGUMENT: CollectiveArgumentError,
    NOT_INITIALIZED: ValueError,
    MISMATCH: HorovodInternalError,
    SHUT_DOWN: HorovodInternalError,
    MPI_ERROR: HorovodInternalError,
    CONFIG_ERROR: ValueError,
    UNSUPPORTED: NotImplementedError,
    TIMEOUT: TimeoutError,
    INTERNAL_ERROR: HorovodInternalError,
    NON_FINITE: HorovodInternalError,  # raised on every rank, like the other collective errors
    WITHDRAWN: HorovodInternalError,  # a timeout ran out (the torch backend's, only)
    RANK_FAILED: HorovodInternalError,  # hvd.elastic.run catches it and goes on
}


def exception_for(status, message):
    """Builds (does not raise) the exception for a non-zero core status."""
    if status == NOT_INITIALIZED and "init()" not in message:
        # The most common user mistake: say how to fix it, whatever the core wrote.
        message = (message or "Perseus is not initialized") + "; call hvd.init() first"
    cls = _EXCEPTION_FOR_STATUS.get(status)
    if cls is None:
        return HorovodInternalError("unknown Perseus status %d: %s" % (status, message))
    return cls(message)
