"""torch.distributed's process-group API over Perseus's init and process sets.

Under mpirun every process is a rank already: init_process_group() starts Perseus
(MPI) and takes rank and world size from MPI. It accepts the arguments a torch
script passes (backend, init_method such as --dist-url, world_size, rank, ...) so
the script runs unchanged, and warns once when they contradict MPI. Groups are
process sets: new_group(ranks) registers one (collectively, as in torch).
"""

from perseus.common import basics as _basics
from perseus.common import process_sets as _process_sets
from perseus.torch.ops import backend_names as _backend_names
from perseus.torch.ops import timeouts as _timeouts
from perseus.torch.ops import world as _world


class ProcessGroup:
    """A group of ranks: what new_group() returns and `group=` accepts.

    Wraps a Perseus ProcessSet (attribute `process_set`). rank() is this process's
    rank in the group (-1 when not a member), size() its number of ranks. `bound`: the
    group's timeout as each call's time limit, (seconds, reason), or None.
    """

    def __init__(self, process_set, timeout=None):
        self.process_set = process_set
        self.destroyed = False  # by destroy_process_group(self): every use is then an error
        self.bound = _timeouts.group_bound(timeout)
        if self.bound is not None and process_set.rank() >= 0:
            # A rank with nothing to do still answers within a fraction of the timeout.
            _timeouts.answer_within(process_set, self.bound[0])

    def rank(self):
        return self.process_set.rank()

    def size(self):
        return self.process_set.size()

    @property
    def ranks(self):
        return list(self.process_set.ranks)

    def __repr__(self):
        return "ProcessGroup(ranks=%s)" % self.process_set.ranks


class group:
    """torch.distributed.group: `group.WORLD` is the group of all ranks."""
    WORLD = ProcessGroup(_process_sets.global_process_set)  # bound: init_process_group's


_WORLD = group.WORLD  # for functions whose `group` parameter hides the class


class _NotAMember:
    """GroupMember.NON_GROUP_MEMBER. torch's new_group returns it to the ranks outside
    the group; the drop-in returns them the group itself, whose rank() is -1 (they still
    name it in destroy_process_group, which is collective). This compares equal to such
    a group, so torch's test `group == GroupMember.NON_GROUP_MEMBER` answers as in
    torch (`is` does not); their calls on it warn and do nothing, as torch's do."""

    def __eq__(self, other):
        # WORLD holds every rank (and answers rank() only after init)
        return other is self or (isinstance(other, ProcessGroup) and other is not _WORLD
                                 and other.rank() == -1)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = object.__hash__

    def __repr__(self):
        return "GroupMember.NON_GROUP_MEMBER"


class GroupMember:
    """torch.distributed.GroupMember: WORLD is group.WORLD; NON_GROUP_MEMBER equals a
    group this rank is not in (_NotAMember)."""
    WORLD = _WORLD
    NON_GROUP_MEMBER = _NotAMember()


def bound_of(group_):
    """The time limit of each call on `group_` (None: the default group): its timeout as
    (seconds, reason), or None."""
    return getattr(_WORLD if group_ is None else group_, "bound", None)


def process_set_of(group_):
    """The registered ProcessSet behind `group=` (None: all ranks)."""
    if group_ is None:
        return _process_sets.global_process_set
    if isinstance(group_, ProcessGroup):
        if group_.destroyed:
            raise ValueError("%r was destroyed by destroy_process_group(); make a new one "
                             "with new_group()" % (group_,))
        process_set = group_.process_set
    elif isinstance(group_, _process_sets.ProcessSet):
        process_set = group_
    else:
        raise ValueError("group must be None, perseus.torch.distributed.group.WORLD or a group "
                         "from perseus.torch.distributed.new_group(), got %r (a %s)"
                         % (group_, type(group_).__name__))
    if process_set.process_set_id is None:
        raise ValueError("%r is not registered (was it destroyed, or created before "
                         "init_process_group()?)" % (group_,))
    return process_set


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                       store=None, group_name="", pg_options=None, device_id=None, **kwargs):
    """Starts Perseus on every rank of the MPI job (torch's signature).

    backend, init_method, store, group_name, pg_options and device_id are accepted and
    not needed: MPI launches the ranks and Perseus picks MPI or NCCL per tensor. A
    backend name torch does not know ('glooo') raises ValueError. world_size and rank,
    when given, must match MPI's; if they do not (a script's default `--world-size 1
    --rank 0`), MPI's values win and a warning says so, once. `timeout` (a timedelta;
    None: none) is the default group's, as new_group's for its group: a collective or
    message that not every rank it needs has called within it fails, naming those ranks.
    Calling it again while initialized does nothing, as `hvd.init()`.
    """
    if backend is not None and not isinstance(backend, str):
        raise ValueError("backend must be a string such as 'nccl', 'gloo' or 'mpi', got %r"
                         % (backend,))
    # Any name torch knows does the same here; a misspelt one is a mistake all the same.
    _backend_names.check(backend, "init_process_group")
    bound = _timeouts.group_bound(timeout)  # checked before anything starts
    if _basics.is_initialized():
        return
    _world.start(world_size, rank)
    _WORLD.bound = bound
    if bound is not None:
        _timeouts.answer_within(_process_sets.global_process_set, bound[0])


def is_initialized():
    return _basics.is_initialized()


# process_set_id -> how many groups of new_group() that are not destroyed use that set:
# groups of the same ranks share one set, which lives until the last of them is destroyed.
_groups_of_set = {}


def destroy_process_group(group=None):
    """Without a group: shuts Perseus down. With one: the group can no longer be used,
    and its process set is unregistered once no other group of the same ranks uses it
    (collective, like new_group)."""
    if group is None or group is _WORLD:
        _basics.shutdown()
        _WORLD.bound = None
        _groups_of_set.clear()
        return
    process_set = process_set_of(group)
    if isinstance(group, ProcessGroup):
        group.destroyed = True
        users = _groups_of_set.pop(process_set.process_set_id, 1) - 1
        if users > 0:  # other groups of these ranks still use the set
            _groups_of_set[process_set.process_set_id] = users
            return
    if process_set is not _process_sets.global_process_set:
        _process_sets.remove_process_set(process_set)


def get_rank(group=None):
    """This process's rank: global, or within `group` (-1 when not a member)."""
    if group is None:
        return _basics.rank()
    return process_set_of(group).rank()


def get_world_size(group=None):
    """The number of ranks in `group` (-1 on a rank outside it, as torch answers)."""
    if group is None:
        return _basics.size()
    process_set = process_set_of(group)
    return process_set.size() if process_set.included() else -1


def get_process_group_ranks(group):
    """The global ranks of `group` (None: every rank), in group-rank order."""
    return list(process_set_of(group).ranks)


def get_global_rank(group, group_rank):
    """The global rank of rank `group_rank` of `group` (of WORLD: `group_rank` as it is,
    unchecked, as torch answers)."""
    if group is _WORLD:
        return group_rank
    ranks = get_process_group_ranks(group)
    if not isinstance(group_rank, int) or not 0 <= group_rank < len(ranks):
        raise ValueError("Group rank %r is not part of group %r" % (group_rank, group))
    return ranks[group_rank]


def get_group_rank(group, global_rank):
    """The rank within `group` of global rank `global_rank` (of WORLD: `global_rank` as
    it is, unchecked, as torch answers)."""
    if group is _WORLD:
        return global_rank
    ranks = get_process_group_ranks(group)
    if global_rank not in ranks:
        raise ValueError("Global rank %r is not part of group %r" % (global_rank, group))
    return ranks.index(global_rank)


def get_local_rank():
    """This process's rank on its node: the GPU it should use."""
    return _basics.local_rank()


def get_local_size():
    return _basics.local_size()


def get_node_local_rank(fallback_rank=None):
    """This process's rank on its node, as get_local_rank(). torch reads it from
    torchrun's LOCAL_RANK; here it comes from MPI, so before init_process_group() only
    `fallback_rank` answers (a RuntimeError without one, as torch's without LOCAL_RANK)."""
    if _basics.is_initialized():
        return _basics.local_rank()
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("get_node_local_rank(): the node-local rank comes from MPI, known once "
                       "init_process_group() has run; call it first, or pass fallback_rank")


def get_backend(group=None):
    """"perseus"; a ValueError on a rank outside `group`, as torch's."""
    if process_set_of(group).included() is False:
        raise ValueError("Invalid process group specified")  # torch's text
    return "perseus"


def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization=False, group_desc=None, device_id=None):
    """A group of `ranks` (global ranks; None: all). Collective, as in torch: every
    rank calls it, in the same order, with the same ranks. A group with the ranks of
    one that exists shares its process set. `timeout` (a timedelta; None: none) bounds
    each call on the group, as init_process_group's does the default group's."""
    if use_local_synchronization:
        raise NotImplementedError("new_group(use_local_synchronization=True) is not supported "
                                  "by Perseus: every rank must call new_group()")
    _timeouts.group_bound(timeout)  # a wrong type fails before the collective registration
    made = ProcessGroup(_world.set_of_ranks(ranks), timeout)
    set_id = made.process_set.process_set_id
    _groups_of_set[set_id] = _groups_of_set.get(set_id, 0) + 1
    return made
