"""init(process_sets=[...]) of rank lists is all or nothing, its ids follow the order
given, and a set registered before keeps its id (Horovod's static process sets); a
ProcessSet whose id names no registered set of its ranks is a ValueError before
anything is sent. (Sets of per-rank communicators: tests/rank_scripts/init_mpi4py.py.)"""
import torch

from common import hvd, init, main

ids = None  # hvd.mpi_ops._basics._get_process_set_ids_and_ranks, after init


def expect_value_error(what, fn, says):
    try:
        fn()
    except ValueError as e:
        assert says in str(e), "%s: %s" % (what, e)
    else:
        raise AssertionError("%s: no ValueError" % what)


def failed_inits(size):
    everyone = list(range(size))
    for what, sets, says in (
            ("a set twice", [[0], [size - 1], [0]], "entry 2 is a duplicate"),
            ("the global set's ranks", [[0], everyone], "entry 1 is a duplicate"),
            ("a rank past the world", [[0], [size]], "names rank %d" % size)):
        expect_value_error(what, lambda: hvd.init(process_sets=sets), says)
        assert ids() == {0: everyone}, (what, ids())  # none of the list was registered


def body():
    global ids
    rank, size = init()
    ids = hvd.mpi_ops._basics._get_process_set_ids_and_ranks
    failed_inits(size)
    # A valid list after the failed ones: ids 1, 2 in the order given, whatever order each
    # rank lists the members in.
    evens = hvd.ProcessSet(list(range(0, size, 2)))
    odd_members = list(range(1, size, 2))
    odds = hvd.ProcessSet(odd_members[::-1] if rank % 2 else odd_members)
    hvd.init(process_sets=[evens, odds])
    assert (evens.process_set_id, odds.process_set_id) == (1, 2), (evens, odds)
    assert ids() == {0: list(range(size)), 1: evens.ranks, 2: odds.ranks}, ids()
    mine = evens if rank % 2 == 0 else odds
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, process_set=mine, name="static.sum")
    assert torch.equal(out, torch.full((3,), float(len(mine.ranks)))), out
    # init() again: a set registered before takes its id (as Horovod), a new one the next.
    again, pair = hvd.ProcessSet(evens.ranks), hvd.ProcessSet([0, 1])  # pair: new at np > 2
    hvd.init(process_sets=[again, pair] if size > 2 else [again])
    assert again.process_set_id == 1, again
    expected = {0: list(range(size)), 1: evens.ranks, 2: odds.ranks}
    if size > 2:
        assert pair.process_set_id == 3, pair
        expected[3] = [0, 1]
    assert ids() == expected, ids()
    if size > 2:
        hvd.remove_process_set(pair)

    # Unregistered sets: an id set by hand, or a registered id with other ranks.
    forged = hvd.ProcessSet([0])
    forged.process_set_id = 10
    for fn in (lambda: hvd.allreduce(torch.ones(2), process_set=forged, name="forged"),
               lambda: hvd.broadcast(torch.ones(2), 0, process_set=forged, name="forged.bc"),
               lambda: hvd.allgather(torch.ones(2), process_set=forged, name="forged.ag")):
        expect_value_error("id 10 by hand", fn, "is not registered")
    other = hvd.ProcessSet([0])
    other.process_set_id = odds.process_set_id  # odds' id, but not odds' ranks
    expect_value_error("another set's id", lambda: hvd.allreduce(torch.ones(2), process_set=other,
                                                                  name="forged.other"), "is not registered")
    # The engine is fine after the refused calls.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after"), torch.full((2,), float(size)))
    hvd.remove_process_set(evens)
    hvd.remove_process_set(odds)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
