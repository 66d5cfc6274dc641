"""torch.distributed's new_subgroups and new_subgroups_by_enumeration over new_group():
every rank registers every subgroup, in the same order (collective, as in torch), and
keeps the one it belongs to."""

from perseus.common import basics as _basics
from perseus.torch.distributed.process_group import get_process_group_ranks, new_group


def new_subgroups(group_size=None, group=None, timeout=None, backend=None, pg_options=None,
                  group_desc=None):
    """Splits `group` (None: every rank) into consecutive subgroups of `group_size` ranks
    -> (this rank's subgroup, all subgroups). `group_size` defaults to the ranks on one
    node (MPI's local size: one process per GPU, where torch counts the node's GPUs)."""
    if group_size is None:
        group_size = _basics.local_size()
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0:
        raise ValueError("new_subgroups: group_size must be a positive integer, got %r" % (group_size,))
    ranks = get_process_group_ranks(group)
    if group_size > len(ranks) or len(ranks) % group_size:
        raise ValueError("new_subgroups: the group's %d ranks cannot be split into subgroups of "
                         "group_size=%d" % (len(ranks), group_size))
    split = [ranks[i:i + group_size] for i in range(0, len(ranks), group_size)]
    return new_subgroups_by_enumeration(split, timeout, backend, pg_options, group_desc)


def new_subgroups_by_enumeration(ranks_per_subgroup_list, timeout=None, backend=None,
                                 pg_options=None, group_desc=None):
    """One subgroup per list of global ranks -> (this rank's subgroup, or None when it is
    in none; all subgroups). A rank may be in one subgroup at most."""
    if not ranks_per_subgroup_list:
        raise ValueError("new_subgroups_by_enumeration: ranks_per_subgroup_list is empty")
    owner = {}
    for index, ranks in enumerate(ranks_per_subgroup_list):
        for rank in ranks:
            if rank in owner:
                raise ValueError("new_subgroups_by_enumeration: rank %r is in subgroup %d and in "
                                 "subgroup %d" % (rank, owner[rank], index))
            owner[rank] = index
    subgroups = [new_group(ranks, timeout, backend, pg_options, group_desc=group_desc)
                 for ranks in ranks_per_subgroup_list]
    mine = owner.get(_basics.rank())
    return (None if mine is None else subgroups[mine]), subgroups
