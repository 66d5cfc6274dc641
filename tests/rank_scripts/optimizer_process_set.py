"""DistributedOptimizer(process_set=S) built on every rank, as Horovod allows: S's
members average their gradients among themselves; a rank outside S communicates
nothing for it and steps on its own gradients. Against plain torch in one process: a
member's weights are those of training on the members' rows together, a non-member's
those of training on its own rows; members end bit-identical. At np=2 the sets are
{0} and {1}, at np=4 the even and the odd ranks; with and without gradient views."""
import torch

import optimizer as opt_tests
from common import hvd, init, log, main


def rows_of(ranks, size):
    x, y = opt_tests.batch()
    per = opt_tests.BATCH // size
    pick = torch.cat([torch.arange(r * per, (r + 1) * per) for r in ranks])
    return x[pick], y[pick]


def body():
    rank, size = init()
    evens = hvd.add_process_set(list(range(0, size, 2)))
    odds = hvd.add_process_set(list(range(1, size, 2)))
    for chosen in (evens, odds):
        for views in (True, False):
            what = "optimizer on %s, views %s" % (chosen.ranks, views)
            got = opt_tests.distributed(rank, size, process_set=chosen, check_pending=False,
                                        gradient_as_bucket_view=views)
            member = rank in chosen.ranks
            trained_on = chosen.ranks if member else [rank]
            expected = opt_tests.reference(data=lambda: rows_of(trained_on, size))
            worst = opt_tests.compare(got, expected, opt_tests.TOL, what)
            flat = torch.cat([w.flatten() for w in got])
            everyone = hvd.allgather_object(flat, name="ps_opt.%s.%s" % (chosen.ranks, views))
            for r in chosen.ranks:
                assert torch.equal(everyone[r], everyone[chosen.ranks[0]]), \
                    "%s: member %d's weights differ from member %d's" % (what, r, chosen.ranks[0])
            if rank == 0:
                log("%s: max |diff| %.3g" % (what, worst))
    hvd.remove_process_set(evens)
    hvd.remove_process_set(odds)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
