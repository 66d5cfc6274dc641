"""Collectives of different process sets must not block each other.

Set A (the first half of the ranks) runs a sequence of collectives while
  * set B (the other half) has a collective in flight that cannot finish until A is done:
    B's last rank submits it only after A signals completion through a file, and
  * a global allreduce is in flight: every rank but the last submitted it at the start.
If an engine serialised work across sets (or behind the pending global request), A
would wait for B, B for A, and the job would hang until the test's timeout.
"""
import torch

from common import (assert_equal, assert_reduced, hvd, init, main, make_tensor, touch, wait_for)


def body():
    rank, size = init()
    assert size >= 2, "needs two ranks or more"
    set_a = list(range(size // 2))
    set_b = list(range(size // 2, size))
    ps_a = hvd.add_process_set(set_a)
    ps_b = hvd.add_process_set(set_b)
    last = size - 1  # in set B

    g_inputs = [make_tensor("psc.global", r, (1000,), torch.float32) for r in range(size)]
    g_handle = None
    if rank != last:
        g_handle = hvd.allreduce_async(g_inputs[rank], name="psc.global", op=hvd.Sum)

    if rank in set_a:
        me = set_a.index(rank)
        for i in range(10):
            name = "psc.a.ar.%d" % i
            xs = [make_tensor(name, r, (50,), torch.float64) for r in set_a]
            assert_reduced(hvd.allreduce(xs[me], name=name, op=hvd.Sum, process_set=ps_a),
                           xs, hvd.Sum, torch.float64, name)
            name = "psc.a.bc.%d" % i
            root = set_a[i % len(set_a)]
            out = hvd.broadcast(make_tensor(name, rank, (8,), torch.int32), root, name=name, process_set=ps_a)
            assert_equal(out, make_tensor(name, root, (8,), torch.int32), name)
        touch("a_done.%d" % rank)
    else:
        me = set_b.index(rank)
        # A different sequence: allgathers first, then the request that waits on A.
        for i in range(3):
            name = "psc.b.ag.%d" % i
            xs = [make_tensor(name, r, (set_b.index(r) + 1, 2), torch.float32) for r in set_b]
            assert_equal(hvd.allgather(xs[me], name=name, process_set=ps_b), torch.cat(xs), name)
        if rank == last:
            for r in set_a:
                wait_for("a_done.%d" % r, timeout_s=60)
        name = "psc.b.blocked"
        xs = [make_tensor(name, r, (20,), torch.int64) for r in set_b]
        assert_reduced(hvd.allreduce(xs[me], name=name, op=hvd.Max, process_set=ps_b),
                       xs, hvd.Max, torch.int64, name)
        if rank == last:
            g_handle = hvd.allreduce_async(g_inputs[rank], name="psc.global", op=hvd.Sum)

    assert_reduced(hvd.synchronize(g_handle), g_inputs, hvd.Sum, torch.float32, "psc.global")
    hvd.remove_process_set(ps_a)
    hvd.remove_process_set(ps_b)
    hvd.shutdown()


main(body)
