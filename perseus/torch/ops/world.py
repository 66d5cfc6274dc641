"""torch.distributed's world over MPI's: what the drop-in's init_process_group and
new_group and the c10d backend's share. Every process is a rank already (mpirun
started it): starting means starting Perseus, and a group is a process set.
"""

import time
import warnings

from perseus.common import basics as _basics
from perseus.common import objects as _objects
from perseus.common import process_sets as _process_sets
from perseus.common.ops import integer

_warned_about_arguments = False
_STALL_CHECK = "PERSEUS_STALL_CHECK_TIME_SECONDS"


def start(world_size=-1, rank=-1, stacklevel=3):
    """Starts Perseus (if it is not running). A script's world_size and rank are MPI's
    or contradict it (a default `--world-size 1 --rank 0`): MPI's win, and a warning
    says so, once per process."""
    global _warned_about_arguments
    _basics.init()
    given = [(what, value) for what, value in (("world_size", world_size), ("rank", rank))
             if value is not None and int(value) >= 0]
    actual = {"world_size": _basics.size(), "rank": _basics.rank()}
    wrong = ["%s=%s (MPI: %d)" % (what, value, actual[what]) for what, value in given
             if int(value) != actual[what]]
    if wrong and not _warned_about_arguments:
        _warned_about_arguments = True
        warnings.warn("init_process_group(%s) contradicts the MPI job Perseus runs in; using "
                      "MPI's rank %d of %d" % (", ".join(wrong), actual["rank"],
                                               actual["world_size"]), stacklevel=stacklevel)


def set_of_ranks(ranks):
    """The process set of `ranks` (global ranks, any iterable; None: all), registered
    now if no set of those ranks is. Collective, as torch's new_group: every rank calls
    it, in the same order, with the same ranks (one small allgather checks that first).
    Ranks that differ are a ValueError on every rank, naming what each passed: without
    the check, a rank that finds a set of its ranks registered skips the registration
    its peers wait in (a hang)."""
    ranks = _agreed(ranks)
    return _process_sets.find_process_set(ranks) or _process_sets.add_process_set(ranks)


def _agreed(ranks):
    """`ranks` as group_ranks() gives them, once every rank has passed the same;
    otherwise a ValueError on every rank. A rank whose own ranks are refused still takes
    part, so its peers get the same error rather than waiting for it."""
    error = None
    try:
        mine = group_ranks(ranks)
    except (TypeError, ValueError) as e:
        error, mine = e, "(%s)" % e
    everyone = _objects.allgather_object(mine, name="perseus.new_group", bound=_meeting_bound())
    if any(theirs != mine for theirs in everyone):
        raise ValueError("new_group: every rank must pass the same ranks, in the same order of "
                         "calls; the ranks passed %s" % "; ".join(
                             "rank %d %s" % (rank, theirs) for rank, theirs in enumerate(everyone)))
    if error is not None:  # the same on every rank
        raise error
    return mine


def _meeting_bound():
    """How long the ranks wait for each other in new_group: the stall check time, as
    for the core's own registration (Engine::Meet), so a rank that never calls it is
    an error naming it, not a hang."""
    limit_s = _basics.meeting_seconds()
    return (time.monotonic() + limit_s,
            "within %g s (%s): new_group must be called on every rank" % (limit_s, _STALL_CHECK))


def group_ranks(ranks):
    """A new group's `ranks` (global ranks, any iterable; None: all) as a sorted list;
    ValueError or TypeError, naming them, where they cannot make a group."""
    size = _basics.size()  # raises before init
    if ranks is None:
        ranks = range(size)
    ranks = sorted(integer(r, "new_group rank") for r in ranks)
    bad = [r for r in ranks if not 0 <= r < size]
    if bad:
        raise ValueError("new_group: ranks %s are outside the world of %d ranks" % (bad, size))
    if len(set(ranks)) != len(ranks):
        raise ValueError("new_group: ranks must be distinct, got %s" % ranks)
    return ranks
