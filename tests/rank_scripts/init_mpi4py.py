"""init() when the application initialised MPI first (mpi4py imported before perseus),
init(comm=MPI.COMM_WORLD), init(comm=<a split communicator>), and raw mpi4py calls
working alongside an initialised (and a shut down) Perseus; process sets built from
per-rank communicators (Horovod's test_process_sets_multi_comm cases)."""
from mpi4py import MPI  # noqa: I001 -- must come first: MPI is initialised here

import torch

from common import assert_reduced, expect_raises, hvd, main, make_tensor

WORLD = MPI.COMM_WORLD
ids = None  # hvd.mpi_ops._basics._get_process_set_ids_and_ranks


def check_group_sum(name, group, index):
    """Allreduce within the current Perseus world, whose members are the global ranks
    `group`; this process is group[index]."""
    xs = [make_tensor(name, r, (9,), torch.float64) for r in group]
    assert_reduced(hvd.allreduce(xs[index], name=name, op=hvd.Sum), xs, hvd.Sum, torch.float64, name)


def check_set_sum(name, process_set, members, rank):
    """A Sum allreduce on `process_set`, whose members are the global ranks `members`."""
    xs = [make_tensor(name, r, (5,), torch.float64) for r in members]
    got = hvd.allreduce(xs[members.index(rank)], name=name, op=hvd.Sum, process_set=process_set)
    assert_reduced(got, xs, hvd.Sum, torch.float64, name)


def check_communicator_sets(rank, size):
    """init(comm=WORLD, process_sets=[hvd.ProcessSet(subcomm), ...]) with each rank's own
    communicator of a Split: ids as Horovod's, duplicates raising ValueError on the
    ranks where Horovod raises, then add_process_set of communicator sets."""
    everyone, evens, odds = list(range(size)), list(range(0, size, 2)), list(range(1, size, 2))
    members = evens if rank % 2 == 0 else odds
    sub = WORLD.Split(rank % 2, rank)
    world_clone, sub_clone = WORLD.Dup(), sub.Dup()
    S = hvd.ProcessSet
    assert repr(S(sub)) == "ProcessSet(process_set_id=None, ranks=None, mpi_comm=%s)" % sub

    def init_with(sets):
        hvd.init(comm=WORLD, process_sets=sets)

    # Lists that do not fit together: ValueError on every rank, nothing registered.
    expect_raises(ValueError, "lists of different lengths", init_with,
                  [S(sub), S([0])] if rank == 0 else [S(sub)], contains=("rank 0 passed",))
    assert ids() == {0: everyone}, ids()
    # A duplicate on every rank: ValueError everywhere, nothing registered.
    for what, sets in (("3+ duplicates", [S(sub), S(world_clone), S(sub_clone), S(evens), S([0])]),
                       ("the world's communicator again", [S(sub), S(world_clone), S([0])]),
                       ("a communicator twice", [S(sub), S(sub_clone)])):
        expect_raises(ValueError, what, init_with, sets, contains=("is a duplicate",))
        assert ids() == {0: everyone}, (what, ids())
    assert hvd.global_process_set.mpi_comm is WORLD
    # A communicator and a rank list of the same ranks: a duplicate on the even ranks
    # only. As Horovod, they raise, the odd ranks go on, the sets are registered.
    sets = [S(sub), S(evens)]
    if rank % 2 == 0:
        expect_raises(ValueError, "evens twice", init_with, sets, contains=("entry 1 is a duplicate",))
        assert (sets[0].process_set_id, sets[1].process_set_id) == (1, None), sets
    else:
        init_with(sets)
        assert (sets[0].process_set_id, sets[1].process_set_id) == (2, 1), sets
    assert ids() == {0: everyone, 1: evens, 2: odds}, ids()

    # Horovod's last, valid list: the sets registered above keep their ids.
    mine, zero = S(sub), S([0])
    init_with([mine, zero] if size > 2 else [mine])
    expected = {0: everyone, 1: evens, 2: odds}
    if size > 2:
        expected[3] = [0]
    assert ids() == expected, ids()
    assert (mine.process_set_id, mine.ranks) == (1 + rank % 2, members), mine
    assert repr(mine) == "ProcessSet(process_set_id=%d, ranks=%s, mpi_comm=%s)" % (
        1 + rank % 2, members, sub), repr(mine)
    assert repr(hvd.global_process_set) == "ProcessSet(process_set_id=0, ranks=%s, mpi_comm=%s)" % (
        everyone, WORLD), repr(hvd.global_process_set)
    check_set_sum("m4p.parity", mine, members, rank)
    if size > 2:
        assert zero.process_set_id == 3, zero
        if rank == 0:
            check_set_sum("m4p.zero", zero, [0], rank)

    # add_process_set of each rank's communicator (a Perseus addition) registers every
    # rank's set, sorted; one registered before is a duplicate on its ranks.
    pairs = WORLD.Split(rank // 2, rank)  # np 4: {0, 1} and {2, 3}; np 2: the world
    if size == 2:
        expect_raises(ValueError, "the world's ranks", hvd.add_process_set, S(pairs),
                      contains=("Attempted to add a duplicate process set",))
    else:
        pair = hvd.add_process_set(S(pairs))
        assert pair.process_set_id == 4 + rank // 2, pair
        assert ids() == {**expected, 4: [0, 1], 5: [2, 3]}, ids()
        check_set_sum("m4p.pair", pair, pair.ranks, rank)
    expect_raises(ValueError, "a registered communicator's set", hvd.add_process_set, S(sub_clone),
                  contains=("Attempted to add a duplicate process set",))
    WORLD.Barrier()
    hvd.shutdown()
    assert hvd.global_process_set.mpi_comm is None
    for comm in (sub, world_clone, sub_clone, pairs):
        comm.Free()


def check_sets_in_split_world(sub):
    """In a world made by init(comm=sub), a communicator's ranks are numbered in that
    world; one with members outside it is a ValueError on every rank."""
    assert hvd.global_process_set.mpi_comm is sub
    expect_raises(ValueError, "members outside the world", hvd.add_process_set, hvd.ProcessSet(WORLD),
                  contains=("outside the Perseus world",))
    if sub.Get_size() > 1:
        halves = sub.Split(sub.Get_rank() % 2, sub.Get_rank())
        half = hvd.add_process_set(hvd.ProcessSet(halves))
        assert half.ranks == [hvd.rank()], half
        assert ids() == {0: list(range(hvd.size())), 1: [0], 2: [1]}, ids()
        halves.Free()


def body():
    global ids
    ids = hvd.mpi_ops._basics._get_process_set_ids_and_ranks
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
    check_sets_in_split_world(sub)
    WORLD.Barrier()
    hvd.shutdown()
    sub.Free()

    check_communicator_sets(world_rank, world_size)

    # Back to the whole world after a split-communicator session.
    hvd.init()
    assert hvd.size() == world_size and hvd.global_process_set.mpi_comm is None
    check_group_sum("m4p.again", everyone, world_rank)
    hvd.shutdown()
    assert WORLD.allreduce(1) == world_size, "raw MPI after shutdown()"


main(body)
