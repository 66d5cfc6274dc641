"""Nodes of different sizes, on one machine: MPICH's hydra takes `localhost`,
`127.0.0.1` and this machine's host name for three hosts (`mpirun -hosts
localhost:1,127.0.0.1:2`), all started here, and MPI's shared-memory split follows
them. tests/rank_scripts/node_layout.py checks on every rank the local and cross ranks,
is_homogeneous() and the per-node process sets against the layout it is given.
One host (the usual job) is init_basic.py's; two real hosts are tests/launch/test_multi_host.py's."""
import socket

import pytest

from support.jobs import find_mpirun

pytestmark = pytest.mark.mpi

# Ranks per host, in hydra's host order.
LAYOUTS = {
    "1+2": [("localhost", 1), ("127.0.0.1", 2)],                          # a smaller node first
    "3+2+1": [("localhost", 3), ("127.0.0.1", 2), (socket.gethostname(), 1)],
    "2+2": [("localhost", 2), ("127.0.0.1", 2)],                          # homogeneous
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_nodes_of_different_sizes(run_mpi, layout):
    hosts = LAYOUTS[layout]
    spec = ",".join("%s:%d" % host for host in hosts)
    sizes = ",".join(str(n) for _, n in hosts)
    run_mpi("node_layout", sum(n for _, n in hosts), env={"NODE_SIZES": sizes}, timeout=60,
            launcher=[find_mpirun(), "-hosts", spec])
