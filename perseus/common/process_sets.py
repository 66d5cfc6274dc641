"""Process sets: subsets of ranks that collectives can be limited to (Horovod API).

A ProcessSet is a plain description (sorted global ranks, or an mpi4py communicator)
until add_process_set() or init(process_sets=...) registers it with the core, which
gives it an id. Registering and removing are collective: every rank calls them, in
the same order, with the same ranks, or each with its own communicator (e.g. from
MPI.COMM_WORLD.Split), whose sets are then all registered on every rank.
global_process_set (id 0, all ranks) always exists while Perseus is initialized.

A registered set caches its size and this process's rank in it (the core's
answers at registration), so adapters can shape outputs without a core call.
"""

import ctypes
import threading
import warnings

from perseus.common import library as _lib
from perseus.common.ops import GLOBAL_PROCESS_SET, integer


class ProcessSet:
    """A set of global ranks, given as a list of ranks (integers: ops.integer) or an
    mpi4py communicator.

    Attributes: process_set_id (None until registered), ranks (sorted list of
    global ranks; for a communicator, None until registered, as Horovod), mpi_comm
    (the communicator it was built from, or None).
    """

    def __init__(self, ranks_or_comm):
        self.process_set_id = None
        self.mpi_comm = None
        self._size = None  # cached at registration
        self._rank = None
        if hasattr(ranks_or_comm, "Get_group"):
            # Its ranks are numbered in the Perseus world, which init(comm=...) fixes:
            # they are found at registration.
            self.mpi_comm = ranks_or_comm
            self.ranks = None
            return
        ranks = [integer(r, "a process set rank") for r in ranks_or_comm]
        ranks.sort()
        if len(set(ranks)) != len(ranks):
            raise ValueError("process set ranks must be distinct, got %s" % ranks)
        if ranks and ranks[0] < 0:
            raise ValueError("process set ranks must be non-negative, got %s" % ranks)
        self.ranks = ranks

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
        # Horovod's text (its __str__), which scripts compare.
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=%s)" % (
            self.process_set_id, self.ranks, self.mpi_comm)


def _world_ranks(comm):
    """The sorted ranks of an mpi4py communicator's members in the Perseus world
    (init's communicator, else MPI_COMM_WORLD); ValueError for a member outside it."""
    from mpi4py import MPI  # only needed for communicator-built sets
    world = global_process_set.mpi_comm if global_process_set.mpi_comm is not None else MPI.COMM_WORLD
    group, world_group = comm.Get_group(), world.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world_group)
    finally:
        group.Free()
        world_group.Free()
    if MPI.UNDEFINED in ranks:
        raise ValueError("the communicator of a ProcessSet has members outside the Perseus "
                         "world (%d ranks)" % world.Get_size())
    return sorted(ranks)


# Id 0 always denotes all ranks; its ranks are filled in by init().
global_process_set = ProcessSet([])
global_process_set.process_set_id = GLOBAL_PROCESS_SET

_lock = threading.Lock()
_registered = {}  # id -> ProcessSet, not including the global set
# objects.allgather_object over the world, for the sets of per-rank communicators;
# basics.init() hands it over, as the collectives sit above this module.
_gather = None


def add_process_set(process_set):
    """Registers a ProcessSet (or a list of ranks) with the core; returns the set.

    Collective: all ranks must call it in the same order with the same ranks, or each
    with a ProcessSet of its own communicator (a Perseus addition: Horovod takes those
    in init() only), which registers the sets of every rank's communicator.
    Raises ValueError (as Horovod) when a set with the same ranks is already
    registered, whether through this object or another.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.mpi_comm is not None:
        return _add_communicator_set(process_set)
    if not process_set.ranks:
        raise ValueError("a process set needs at least one rank")
    with _lock:
        # As Horovod: a ValueError on every rank (all call this with the same ranks),
        # nothing registered; the existing set stays usable and removable (a set that
        # a failed step left behind: find_process_set(ranks), remove_process_set()).
        existing = _find(process_set.ranks)
        if existing is not None:
            raise ValueError(_duplicate_text(process_set, existing))
        _register(process_set, process_set.ranks)
    return process_set


def _duplicate_text(process_set, existing):
    return ("Attempted to add a duplicate process set: %r; a set with these ranks is "
            "registered (id %d): use it, or remove it first"
            % (process_set, existing.process_set_id))


def _register(process_set, ranks):
    """Registers `ranks` with the core (collective) as `process_set`; the caller holds
    _lock and found no set with these ranks."""
    n = len(ranks)
    new_id = ctypes.c_int32()
    _lib.check(_lib.perseus_add_process_set((ctypes.c_int32 * n)(*ranks), n,
                                            ctypes.byref(new_id)))
    process_set.ranks = list(ranks)
    process_set._registered(new_id.value)
    _registered[new_id.value] = process_set


def _add_communicator_set(process_set):
    """add_process_set(ProcessSet(comm)): the distinct sets of every rank's
    communicator are registered, on every rank, in _agree()'s order; ValueError on
    the ranks whose own set was registered before (the new ones are registered)."""
    (ranks,), _, order = _agree([process_set], global_process_set.size())
    with _lock:
        existing = _find(list(ranks))
        for other in order:
            if _find(list(other)) is None:
                _register(process_set if other == ranks else ProcessSet(list(other)), other)
    if existing is not None:
        raise ValueError(_duplicate_text(process_set, existing))
    return process_set


def add_process_sets(process_sets, world_size):
    """init(process_sets=...), as Horovod's static process sets: the sets are registered
    in _agree()'s order (ids 1, 2, ... in the order given, for rank lists), and each
    entry gets the id of its set, one registered before included.

    An entry whose set is the global one or an earlier entry's is a duplicate: its id
    stays None and init() raises ValueError on that rank. When that is every rank
    (always so with rank lists alone), nothing is registered, so a corrected init()
    starts clean; when only some ranks' communicators make a duplicate, the sets are
    registered and the other ranks go on, as on Horovod."""
    sets = [s if isinstance(s, ProcessSet) else ProcessSet(s) for s in process_sets]
    if not sets:
        return sets
    mine, lists, order = _agree(sets, world_size)
    world = tuple(range(world_size))
    duplicates = _duplicates(mine, world)
    if duplicates and all(_duplicates(entries, world) for entries in lists):
        raise ValueError(_duplicate_entry_text(sets, mine, duplicates[0], world)
                         + "; none of the sets was registered")
    with _lock:
        for ranks in order:
            if _find(list(ranks)) is None:
                owner = next((s for s, m in zip(sets, mine) if m == ranks), None)
                _register(owner or ProcessSet(list(ranks)), ranks)
        _assign_ids(sets, mine, duplicates)
    if duplicates:
        raise ValueError(_duplicate_entry_text(sets, mine, duplicates[0], world)
                         + "; the sets were registered, as some ranks' lists have no duplicate")
    return sets


def _entry(process_set, world_size):
    """The sorted tuple of the global ranks that `process_set` stands for; ValueError
    when it has none or names a rank outside the world."""
    ranks = process_set.ranks if process_set.mpi_comm is None else _world_ranks(process_set.mpi_comm)
    if not ranks:
        raise ValueError("a process set needs at least one rank")
    if ranks[-1] >= world_size:
        raise ValueError("%r names rank %d, but there are %d ranks"
                         % (process_set, ranks[-1], world_size))
    return tuple(ranks)


def _agree(sets, world_size):
    """(this rank's entries, every rank's entries, the order to register them in); an
    entry is the sorted tuple of a set's global ranks.

    Sets built from communicators differ by rank, so when there are any, every rank's
    list is gathered (a collective) and checked: an error on any rank (a member outside
    the world; lists that differ in length, kind or rank lists) is a ValueError on
    every rank before anything is registered. The order is Horovod's, the same on
    every rank: for each communicator entry, the distinct sets the ranks hold there,
    sorted; then the rank lists, in the order given."""
    comms = [s.mpi_comm is not None for s in sets]
    if not any(comms):
        mine = [_entry(s, world_size) for s in sets]
        return mine, [mine], mine
    try:
        mine, error = [_entry(s, world_size) for s in sets], None
    except ValueError as e:
        mine, error = None, str(e)
    gathered = _gather((error, comms, mine), name="perseus.process_sets")
    for rank, (error, _, _) in enumerate(gathered):
        if error is not None:
            raise ValueError("process sets of rank %d: %s; none was registered" % (rank, error))
    first = _kinds_and_lists(*gathered[0][1:])
    for rank, (_, their_comms, theirs) in enumerate(gathered):
        if _kinds_and_lists(their_comms, theirs) != first:
            raise ValueError("every rank must pass the same kinds of process sets and the same "
                             "rank lists: rank 0 passed %s, rank %d %s; none was registered"
                             % (first, rank, _kinds_and_lists(their_comms, theirs)))
    lists = [theirs for _, _, theirs in gathered]
    order = [ranks for i, comm in enumerate(comms) if comm
             for ranks in sorted({entries[i] for entries in lists})]
    return mine, lists, order + [m for m, comm in zip(mine, comms) if not comm]


def _kinds_and_lists(comms, entries):
    """A rank's list as ranks must agree on it: "<communicator>" or the ranks."""
    return [("<communicator>" if comm else list(ranks)) for comm, ranks in zip(comms, entries)]


def _duplicates(entries, world):
    """Positions of the entries whose set is the global one or an earlier entry's."""
    return [i for i, ranks in enumerate(entries) if ranks == world or ranks in entries[:i]]


def _duplicate_entry_text(sets, entries, i, world):
    of = "the global set's" if entries[i] == world else "entry %d's" % entries.index(entries[i])
    return ("init(process_sets=...): entry %d is a duplicate (its ranks %s are %s): %r"
            % (i, list(entries[i]), of, sets[i]))


def _assign_ids(sets, entries, duplicates):
    """Gives each entry of init's list the id of its registered set; a duplicate's id
    stays None, as Horovod (the caller holds _lock)."""
    kept = {}  # ranks -> the entry that holds their id
    for i, (process_set, ranks) in enumerate(zip(sets, entries)):
        found = _find(list(ranks))
        if i not in duplicates:
            kept[ranks] = process_set
            process_set.ranks = list(ranks)
            process_set._registered(found.process_set_id)
        elif process_set is not kept.get(ranks):  # the same object twice keeps its id
            if found is process_set and ranks in kept:  # the registry's object: replace it
                _registered[found.process_set_id] = kept[ranks]
            process_set.ranks = list(ranks)
            process_set._invalidate()


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
    """Unregisters a set (collective) and returns True. As Horovod, nothing is removed
    and it returns False for the global set, which always exists (with a warning
    saying so); and, silently, for a set that is not registered (never added, or
    removed already), where Horovod fails an assertion."""
    with _lock:
        if process_set.process_set_id is None:
            return False
        if process_set.process_set_id == GLOBAL_PROCESS_SET:
            warnings.warn("remove_process_set(global_process_set): the global process set "
                          "always exists; nothing removed", stacklevel=2)
            return False
        _lib.check(_lib.perseus_remove_process_set(process_set.process_set_id))
        _registered.pop(process_set.process_set_id, None)
        process_set._invalidate()
    return True


def _on_init(mpi_comm, gather):
    """Fills in the global set from the core; called by basics.init() with its mpi4py
    communicator (None for MPI_COMM_WORLD), which global_process_set.mpi_comm is, as
    Horovod, and objects.allgather_object (see _gather)."""
    global _gather
    _gather = gather
    global_process_set.mpi_comm = mpi_comm
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
        global_process_set.mpi_comm = None
