"""Process sets: subsets of ranks that collectives can be limited to (Horovod API).

A ProcessSet is a plain description (sorted global ranks) until add_process_set()
registers it with the core, which gives it an id. Registering and removing are
collective: every rank calls them, in the same order, with the same ranks.
global_process_set (id 0, all ranks) always exists while Perseus is initialized.

A registered set caches its size and this process's rank in it (the core's
answers at registration), so adapters can shape outputs without a core call.
"""

import ctypes
import threading

from perseus.common import library as _lib
from perseus.common.ops import GLOBAL_PROCESS_SET, integer


class ProcessSet:
    """A set of global ranks, given as a list of ranks (integers: ops.integer) or an
    mpi4py communicator.

    Attributes: process_set_id (None until registered), ranks (sorted list of
    global ranks), mpi_comm (the communicator it was built from, or None).
    """

    def __init__(self, ranks_or_comm):
        self.process_set_id = None
        self.mpi_comm = None
        if hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
            ranks = _world_ranks(ranks_or_comm)
        else:
            ranks = [integer(r, "a process set rank") for r in ranks_or_comm]
        ranks.sort()
        if len(set(ranks)) != len(ranks):
            raise ValueError("process set ranks must be distinct, got %s" % ranks)
        if ranks and ranks[0] < 0:
            raise ValueError("process set ranks must be non-negative, got %s" % ranks)
        self.ranks = ranks
        self._size = None  # cached at registration
        self._rank = None

    def _query(self, fn):
        out = ctypes.c_int32()
        _lib.check(fn(self.process_set_id, ctypes.byref(out)))
        return out.value

    def _registered(self, process_set_id):
        self.process_set_id = process_set_id
        self._size = self._query(_lib.perseus_process_set_size)
        self._rank = self._query(_lib.perseus_process_set_rank)

    def _invalidate(self):
        if self is not global_process_set:
            self.process_set_id = None
        self._size = None
        self._rank = None

    def size(self):
        """Number of ranks in the set; None when not registered."""
        if self._size is not None:
            return self._size
        if self.process_set_id is None:
            return None
        return self._query(_lib.perseus_process_set_size)  # raises before init()

    def rank(self):
        """This process's rank within the set, -1 when not a member; None when not
        registered."""
        if self._rank is not None:
            return self._rank
        if self.process_set_id is None:
            return None
        return self._query(_lib.perseus_process_set_rank)  # raises before init()

    def hold(self, gpu=False):
        """(bytes, ms): the core holds this set's CPU requests (GPU ones with gpu=True),
        while no thread waits, until `bytes` are pending or the oldest is `ms` old
        (bytes 0: it does not hold). Autotuning changes it."""
        limit, ms = ctypes.c_int64(), ctypes.c_double()
        _lib.check(_lib.perseus_process_set_hold(self.process_set_id, 1 if gpu else 0,
                                                 ctypes.byref(limit), ctypes.byref(ms)))
        return limit.value, ms.value

    def included(self):
        """Whether this process is a member; None when not registered."""
        r = self.rank()
        return None if r is None else r >= 0

    def __repr__(self):
        comm = "" if self.mpi_comm is None else ", mpi_comm=%s" % (self.mpi_comm,)
        return "ProcessSet(process_set_id=%s, ranks=%s%s)" % (self.process_set_id, self.ranks, comm)


def _world_ranks(comm):
    """Ranks of an mpi4py communicator's members in MPI_COMM_WORLD."""
    from mpi4py import MPI  # only needed for communicator-built sets
    world = MPI.COMM_WORLD.Get_group()
    return list(comm.Get_group().Translate_ranks(range(comm.Get_size()), world))


# Id 0 always denotes all ranks; its ranks are filled in by init().
global_process_set = ProcessSet([])
global_process_set.process_set_id = GLOBAL_PROCESS_SET

_lock = threading.Lock()
_registered = {}  # id -> ProcessSet, not including the global set


def add_process_set(process_set):
    """Registers a ProcessSet (or a list of ranks) with the core; returns the set.

    Collective: all ranks must call it in the same order with the same ranks.
    Raises ValueError (as Horovod) when a set with the same ranks is already
    registered, whether through this object or another.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if not process_set.ranks:
        raise ValueError("a process set needs at least one rank")
    with _lock:
        # As Horovod: a ValueError on every rank (all call this with the same ranks),
        # nothing registered; the existing set stays usable and removable (a set that
        # a failed step left behind: find_process_set(ranks), remove_process_set()).
        existing = _find(process_set.ranks)
        if existing is not None:
            raise ValueError("Attempted to add a duplicate process set: %r; a set with these "
                             "ranks is registered (id %d): use it, or remove it first"
                             % (process_set, existing.process_set_id))
        n = len(process_set.ranks)
        ranks = (ctypes.c_int32 * n)(*process_set.ranks)
        new_id = ctypes.c_int32()
        _lib.check(_lib.perseus_add_process_set(ranks, n, ctypes.byref(new_id)))
        process_set._registered(new_id.value)
        _registered[new_id.value] = process_set
    return process_set


def add_process_sets(process_sets, world_size):
    """init(process_sets=...): all or nothing. The whole list is checked first (ranks
    within the world, no set twice, none with the ranks of a registered set), so that
    an error registers none and a later init(process_sets=...) starts clean; then the
    sets are registered in the order given: ids 1, 2, ... on every rank. Sets already
    registered are left as they are (init() again)."""
    sets = [s if isinstance(s, ProcessSet) else ProcessSet(s) for s in process_sets]
    sets = [s for s in sets if s.process_set_id is None]
    seen = set()
    for s in sets:
        if not s.ranks:
            raise ValueError("a process set needs at least one rank")
        if s.ranks[-1] >= world_size:
            raise ValueError("%r names rank %d, but there are %d ranks" % (s, s.ranks[-1], world_size))
        if tuple(s.ranks) in seen or find_process_set(s.ranks) is not None:
            raise ValueError("Attempted to add a duplicate process set: %r; init(process_sets=...) "
                             "registered none of the sets" % (s,))
        seen.add(tuple(s.ranks))
    for s in sets:
        add_process_set(s)
    return sets


def _find(ranks):
    for existing in [global_process_set] + list(_registered.values()):
        if existing.ranks == ranks:
            return existing
    return None


def find_process_set(ranks):
    """The registered set (the global one included) with exactly these global ranks,
    or None."""
    ranks = sorted(integer(r, "a process set rank") for r in ranks)
    with _lock:
        return _find(ranks)


def registered(process_set_id):
    """The registered set (the global one included) with this id, or None."""
    if process_set_id == GLOBAL_PROCESS_SET:
        return global_process_set
    return _registered.get(process_set_id)


def by_id(process_set_id):
    """The registered set (the global one included) with this id; ValueError when
    none is (e.g. a graph op of a set removed since)."""
    process_set = registered(process_set_id)
    if process_set is None:
        raise ValueError("no process set with id %s is registered" % (process_set_id,))
    return process_set


def ids_and_ranks():
    """{id: global ranks} of every registered set, the global one (id 0) included."""
    with _lock:
        found = {GLOBAL_PROCESS_SET: list(global_process_set.ranks)}
        found.update({i: list(s.ranks) for i, s in _registered.items()})
    return found


def remove_process_set(process_set):
    """Unregisters a set (collective). False when it was not registered."""
    with _lock:
        if process_set.process_set_id is None:
            return False
        if process_set.process_set_id == GLOBAL_PROCESS_SET:
            raise ValueError("the global process set cannot be removed")
        _lib.check(_lib.perseus_remove_process_set(process_set.process_set_id))
        _registered.pop(process_set.process_set_id, None)
        process_set._invalidate()
    return True


def _on_init():
    """Fills in the global set from the core; called by basics.init()."""
    size = ctypes.c_int32()
    _lib.check(_lib.perseus_process_set_size(GLOBAL_PROCESS_SET, ctypes.byref(size)))
    ranks = (ctypes.c_int32 * size.value)()
    _lib.check(_lib.perseus_process_set_ranks(GLOBAL_PROCESS_SET, ranks, size.value,
                                              ctypes.byref(size)))
    global_process_set.ranks = list(ranks)
    global_process_set._registered(GLOBAL_PROCESS_SET)


def _on_shutdown():
    """Invalidates every set; the core forgets them at shutdown."""
    with _lock:
        for process_set in _registered.values():
            process_set._invalidate()
        _registered.clear()
        global_process_set._invalidate()
        global_process_set.ranks = []
