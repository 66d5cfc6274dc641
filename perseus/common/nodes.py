"""Which ranks share a node, real or simulated, and a process set per node.

PERSEUS_RANKS_PER_NODE=k splits the ranks into simulated nodes of k consecutive
ranks (rank r is on node r // k), so node-scoped features (MXNet's
PerseusSyncBatchNorm with comm_scope=0, hierarchical schemes) can be tested on
one machine. Unset: the real nodes, as the core found them at init() (not by
cross_rank, which numbers the ranks of one local rank). The core's configuration
table parses and validates the variable at init() (a bad value, or different values
on different ranks, fail it) and this module reads the value the core took.
"""

from perseus.common import basics as _basics
from perseus.common import process_sets as _process_sets

ENV = "PERSEUS_RANKS_PER_NODE"

_cache = {}  # "set" -> this rank's node ProcessSet (until the set is unregistered)


def ranks_per_node_override():
    """k from PERSEUS_RANKS_PER_NODE as the core validated it, or None when unset."""
    text = _basics.config().get(ENV, "")
    return int(text) if text else None


def node_ranks():
    """The ranks of every node, as a list of sorted lists in node order."""
    size = _basics.size()
    k = ranks_per_node_override()
    if k is not None:
        return [list(range(start, min(start + k, size))) for start in range(0, size, k)]
    nodes = {}
    for rank, node in enumerate(_basics.rank_nodes()):
        nodes.setdefault(node, []).append(rank)
    return [nodes[node] for node in sorted(nodes)]


def node_process_set():
    """The process set of this rank's node (the global set when one node holds every
    rank). The first call registers one set per node, collectively: every rank must
    make it at the same point."""
    cached = _cache.get("set")
    if cached is not None and cached.process_set_id is not None:
        return cached
    rank = _basics.rank()
    mine = _process_sets.global_process_set
    for ranks in node_ranks():
        if len(ranks) == _basics.size():
            break
        found = _process_sets._find(ranks) or _process_sets.add_process_set(ranks)
        if rank in ranks:
            mine = found
    _cache["set"] = mine
    return mine
