"""Nodes of different sizes on one machine: MPICH's hydra takes each name of
`mpirun -hosts localhost:1,127.0.0.1:2` for a host of its own, started here, so MPI's
shared-memory split sees two nodes. NODE_SIZES ("1,2") gives the ranks per host in
that order (hydra fills the hosts in turn); every answer below is computed from it
here and must be the same on every rank:
  - local_rank/local_size, and cross_rank/cross_size (Horovod's: the ranks with one
    local rank, in rank order);
  - is_homogeneous(): every node holds as many ranks. It once read
    size == local_size * cross_size on each rank, which is true on some ranks of nodes
    of 3, 2 and 1 ranks and false on others;
  - nodes.node_ranks() and node_process_set() (MXNet's per-node SyncBatchNorm). They
    once grouped ranks by cross_rank, which on nodes of 1 and 2 ranks put rank 2 with
    rank 0, on another node.
No framework: the common API is what every front end re-exports.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.rank_script import launcher_rank_size, log, main  # noqa: E402

from perseus.common import horovod_api as hvd  # noqa: E402
from perseus.common import nodes  # noqa: E402


def expected_layout(sizes):
    """[[ranks of node 0], [ranks of node 1], ...] for hosts filled in turn."""
    layout, start = [], 0
    for n in sizes:
        layout.append(list(range(start, start + n)))
        start += n
    return layout


def body():
    sizes = [int(n) for n in os.environ["NODE_SIZES"].split(",")]
    assert len(sizes) > 1, "one node: init_basic.py checks it"
    layout = expected_layout(sizes)
    rank, size = launcher_rank_size()
    assert size == sum(sizes), (size, sizes)
    try:
        hvd.is_homogeneous()
        raise AssertionError("is_homogeneous() before init() did not raise")
    except ValueError as e:
        assert "init" in str(e), e

    hvd.init()
    node = next(i for i, ranks in enumerate(layout) if rank in ranks)
    local_rank = layout[node].index(rank)
    same_local_rank = [r for ranks in layout for r in ranks if ranks.index(r) == local_rank]
    seen = {"local": (hvd.local_rank(), hvd.local_size()), "cross": (hvd.cross_rank(), hvd.cross_size()),
            "homogeneous": hvd.is_homogeneous(), "node_ranks": nodes.node_ranks(),
            "node set": nodes.node_process_set().ranks}
    want = {"local": (local_rank, len(layout[node])),
            "cross": (same_local_rank.index(rank), len(same_local_rank)),
            "homogeneous": len(set(sizes)) == 1, "node_ranks": layout,
            "node set": layout[node]}
    wrong = {k: (seen[k], want[k]) for k in want if seen[k] != want[k]}
    assert not wrong, "seen vs expected on nodes of %s: %s" % (sizes, wrong)
    log("layout", sizes, seen)


if __name__ == "__main__":
    main(body)
