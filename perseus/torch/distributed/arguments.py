"""What the drop-in's calls take as `group` and as ranks: the group's process set, and a
root or peer given as a global rank or as a rank within the group (torch's src / group_src,
dst / group_dst)."""

import warnings

from perseus.common.exceptions import CollectiveArgumentError
from perseus.common.ops import integer
from perseus.torch.distributed.process_group import process_set_of


def member_set(group, what):
    """The group's process set, or None (after a warning) when this rank is outside."""
    process_set = process_set_of(group)
    if process_set.rank() < 0:
        warnings.warn("%s: this rank is not a member of %r; the call does nothing"
                      % (what, group), stacklevel=3)
        return None
    return process_set


SOURCE = ("src", "group_src")
DESTINATION = ("dst", "group_dst")


def root(process_set, rank, group_rank, what, names=SOURCE, default=None):
    """The global rank of a root given as `rank` (global) or `group_rank` (in the group),
    the arguments `names` of `what`; `default` (a global rank) when neither is given,
    where torch has one."""
    if rank is None and group_rank is None and default is not None:
        rank = default
    if (rank is None) == (group_rank is None):
        raise CollectiveArgumentError("%s: pass exactly one of %s (global rank) and %s"
                                      % ((what,) + names))
    if group_rank is not None:
        group_rank = integer(group_rank, "%s %s" % (what, names[1]))
        if not 0 <= group_rank < process_set.size():
            raise CollectiveArgumentError("%s: %s %d is outside the group's %d ranks"
                                          % (what, names[1], group_rank, process_set.size()))
        return process_set.ranks[group_rank]
    rank = integer(rank, "%s %s" % (what, names[0]))
    if rank not in process_set.ranks:
        raise CollectiveArgumentError("%s: %s %d is not a member of the group (ranks %s)"
                                      % (what, names[0], rank, process_set.ranks))
    return rank
