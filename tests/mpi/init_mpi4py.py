"""init() when the application initialised MPI first (mpi4py imported before perseus),
init(comm=MPI.COMM_WORLD), init(comm=<a split communicator>), and raw mpi4py calls
working alongside an initialised (and a shut down) Perseus."""
from mpi4py import MPI  # noqa: I001 -- must come first: MPI is initialised here

import torch

from common import assert_reduced, hvd, main, make_tensor

WORLD = MPI.COMM_WORLD


def check_group_sum(name, group, index):
    """Allreduce within the current Perseus world, whose members are the global ranks
    `group`; this process is group[index]."""
    xs = [make_tensor(name, r, (9,), torch.float64) for r in group]
    assert_reduced(hvd.allreduce(xs[index], name=name, op=hvd.Sum), xs, hvd.Sum, torch.float64, name)


def body():
    assert MPI.Is_initialized()
    world_rank, world_size = WORLD.Get_rank(), WORLD.Get_size()
    everyone = list(range(world_size))

    hvd.init()
    assert (hvd.rank(), hvd.size()) == (world_rank, world_size), (hvd.rank(), hvd.size())
    check_group_sum("m4p.default", everyone, world_rank)
    # Raw MPI in the same process while Perseus is up.
    assert WORLD.allreduce(world_rank + 1) == world_size * (world_size + 1) // 2
    hvd.shutdown()
    assert MPI.Is_initialized() and not MPI.Is_finalized(), "shutdown() finalised the application's MPI"

    hvd.init(comm=WORLD)
    assert (hvd.rank(), hvd.size()) == (world_rank, world_size)
    check_group_sum("m4p.world", everyone, world_rank)
    hvd.shutdown()

    # Two halves by parity: each is a world of its own, with its own ranks.
    color = world_rank % 2
    sub = WORLD.Split(color, world_rank)
    group = [r for r in everyone if r % 2 == color]
    hvd.init(comm=sub)
    assert hvd.size() == sub.Get_size() == len(group), (hvd.size(), sub.Get_size())
    assert hvd.rank() == sub.Get_rank() == group.index(world_rank), (hvd.rank(), sub.Get_rank())
    check_group_sum("m4p.split", group, group.index(world_rank))
    WORLD.Barrier()
    hvd.shutdown()
    sub.Free()

    # Back to the whole world after a split-communicator session.
    hvd.init()
    assert hvd.size() == world_size
    check_group_sum("m4p.again", everyone, world_rank)
    hvd.shutdown()
    assert WORLD.allreduce(1) == world_size, "raw MPI after shutdown()"


main(body)
