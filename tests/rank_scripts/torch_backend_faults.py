"""The "perseus" torch backend where things go wrong (issue 48, part 1): every case
ends with an error on the ranks it reaches, or the right result, and never with a
signal or a hang. Run with small stall times (check 1 s, shutdown 3 s).

1. init_process_group and destroy_process_group in a loop, with a new group, a DDP
   step and an asynchronous collective left pending at the destroy: no rank returns
   from init before every rank has connected to rank 0's store.
2. A call refused on one rank (floats to an all_reduce by BXOR, a short all_gather list),
   then retried there: the retry meets the others' call and gives the right result.
3. Different collectives at one turn (all_reduce here, broadcast there): the
   "different collectives under one name" error on every rank; later calls work.
4. The group's timeout (1 s) bounds a collective a rank is alone in: a barrier and an
   all_reduce raise after it (not before), naming the ranks that did not call them.
5. torch's DDP (its C++ reducer) when a bucket's allreduce fails: the peer calls
   shutdown(), the stall shutdown fires, a parameter is unused on one rank only,
   static_graph with ranks that diverge, uneven inputs without join(): a RuntimeError
   on every rank reached, never a segfault.
6. Messages: new_group with ranks that differ across ranks names what each passed, and
   with use_local_synchronization=True is refused at once;
   (np > 2) new_group not called by the last rank names only that rank; a set removed
   on one rank fails a request on another saying it was removed there.
"""
import datetime
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common import expect_raises, hvd, launcher_rank_size, log, main, touch, wait_for

import perseus.torch  # noqa: F401 - registers the backend

RANK, SIZE = launcher_rank_size()
LAST = SIZE - 1
STALL_SHUTDOWN_S = 3.0


def restart(timeout=None):
    """A fresh default group on a fresh engine (after a case that broke the last)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    hvd.shutdown()
    kwargs = {} if timeout is None else {"timeout": datetime.timedelta(seconds=timeout)}
    dist.init_process_group("perseus", **kwargs)


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x, use_b=True):
        y = self.a(x)
        return self.b(y) if use_b else y


def check_init_destroy_loop():
    for round in range(4):
        dist.init_process_group("perseus")
        group = dist.new_group(list(range(SIZE)))
        model = DDP(Two(), process_group=group)
        model(torch.ones(2, 4)).sum().backward()
        t = torch.full((3,), float(RANK))
        work = dist.all_reduce(t, async_op=True)
        if RANK != 0 or round % 2:
            work.wait()  # rank 0 leaves every other one pending across its destroy
            assert torch.equal(t, torch.full((3,), float(sum(range(SIZE))))), t
        dist.destroy_process_group()
    log("init/destroy loop: ok")


def check_refused_then_retried():
    dist.init_process_group("perseus")
    t = torch.full((3,), float(RANK + 1))
    if RANK == 0:
        expect_raises(RuntimeError, "an all_reduce of floats by BXOR", dist.all_reduce,
                      torch.ones(3), op=dist.ReduceOp.BXOR, contains=["BXOR", "integer"])
        expect_raises(ValueError, "a short all_gather list", dist.all_gather,
                      [torch.empty(3)], t)
    dist.all_reduce(t)
    total = float(sum(range(1, SIZE + 1)))
    assert torch.equal(t, torch.full((3,), total)), t
    out = [torch.empty(3) for _ in range(SIZE)]
    dist.all_gather(out, torch.full((3,), float(RANK)))
    assert all(torch.equal(o, torch.full((3,), float(r))) for r, o in enumerate(out)), out
    log("refused then retried: ok")


def check_kind_mismatch():
    t = torch.ones(3)
    if RANK == 0:
        call = lambda: dist.all_reduce(t)  # noqa: E731
    else:
        call = lambda: dist.broadcast(t, 0)  # noqa: E731
    expect_raises(RuntimeError, "all_reduce against broadcast", call, within_s=10,
                  contains=["Mismatched collectives", "allreduce on rank(s) [0]", "broadcast on"])
    x = torch.full((2,), float(RANK))
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((2,), float(sum(range(SIZE))))), x
    log("kind mismatch: ok")


def check_timeout():
    restart(timeout=1.0)
    others = str(list(range(1, SIZE)))
    if RANK == 0:
        for what, call in (("barrier", dist.barrier),
                           ("all_reduce", lambda: dist.all_reduce(torch.ones(2)))):
            start = time.monotonic()
            expect_raises(RuntimeError, "%s alone" % what, call, within_s=4,
                          contains=[" timeout ", "rank(s) %s had not submitted it" % others])
            waited = time.monotonic() - start
            assert waited >= 0.95, "%s gave up after %.2f s, before the timeout" % (what, waited)
        log("timeout: ok")
        touch("timeout_checked")
    else:
        # Not in restart() (a shutdown here would be rank 0's error) until rank 0 is done;
        # a file, not the library under test (was a fixed 3 s sleep).
        wait_for("timeout_checked", timeout_s=30)
    # The turns no longer line up (rank 0 called two more collectives): start afresh.
    restart()


def ddp_case(name, step, steps=3, **ddp_kwargs):
    """Trains DDP(Two()) with step(model, step_index) until it raises; returns the error
    (None if none). A fresh engine before and after."""
    restart()
    torch.manual_seed(0)
    model = DDP(Two(), **ddp_kwargs)
    error = None
    try:
        for i in range(steps):
            if step(model, i) == "stop":
                break
    except RuntimeError as e:
        error = e
    log("%s: %s" % (name, "no error" if error is None else str(error).splitlines()[0][:120]))
    return error


def check_ddp_failures():
    def backward(model, use_b=True):
        model(torch.randn(2, 4), use_b=use_b).sum().backward()

    # The last rank alone uses b: the others' reducers never see its gradients.
    error = ddp_case("unused on one rank", lambda m, i: backward(m, use_b=RANK == LAST))
    assert error is not None, "a parameter unused on one rank only raised nothing"
    # static_graph: the last rank stops using b after the first step.
    error = ddp_case("static graph diverging",
                     lambda m, i: backward(m, use_b=i == 0 or RANK != LAST), static_graph=True)
    assert error is not None, "static_graph with diverging ranks raised nothing"

    # Uneven inputs without join(): the last rank has a step more; the others' exit
    # (their shutdown in restart()) fails it.
    def uneven(model, i):
        if RANK != LAST and i == 2:
            return "stop"
        backward(model)

    error = ddp_case("uneven inputs", uneven)
    assert (error is not None) == (RANK == LAST), error
    if error is not None:
        assert "shut down on rank(s)" in str(error), error

    # Rank 0 shuts Perseus down between steps.
    def peer_shutdown(model, i):
        if RANK == 0 and i == 1:
            hvd.shutdown()
            return "stop"
        backward(model)

    error = ddp_case("peer shutdown", peer_shutdown)
    assert (error is not None) == (RANK != 0), error
    if error is not None:
        assert "shut down on rank(s) [0]" in str(error), error

    # The last rank is late past the stall shutdown time: everyone's set stops.
    def late(model, i):
        if RANK == LAST and i == 1:
            time.sleep(STALL_SHUTDOWN_S + 2)
        backward(model)

    error = ddp_case("stall shutdown", late)
    assert error is not None and "stall shutdown time" in str(error), error
    log("DDP failures: ok")


def check_messages():
    restart()
    # Ranks that pass different ranks to new_group: a ValueError on every rank naming
    # what each passed, also where some find a set of their ranks registered (the
    # world's) and would skip the registration the others wait in (it hung).
    expect_raises(ValueError, "new_group ranks that differ", dist.new_group,
                  [0] if RANK == 0 else None, within_s=10,
                  contains=["rank 0 [0]; rank 1 %s" % list(range(SIZE))])
    # Only the members would call it: refused at once on each caller (it waited for the
    # others until the stall check time), as torch refuses it for MPI.
    if RANK < 2:
        expect_raises(ValueError, "new_group(use_local_synchronization=True)", dist.new_group,
                      [0, 1], use_local_synchronization=True, within_s=1,
                      contains=["doesn't support use_local_synchronization=True"])
    if SIZE < 3:
        return
    # new_group without the last rank's call: only the last rank is named.
    # The ranks that wait for another's error stay out of restart() until it came (their
    # shutdown would be the error); files, not the library under test (were fixed
    # sleeps of 4 s and 8 s).
    if RANK != LAST:
        expect_raises(RuntimeError, "new_group without rank %d" % LAST, dist.new_group,
                      list(range(SIZE - 1)), within_s=15,
                      contains=["rank(s) [%d] had not submitted it within 1 s" % LAST])
        touch("new_group_failed.%d" % RANK)
    else:
        for rank in range(SIZE - 1):
            wait_for("new_group_failed.%d" % rank, timeout_s=30)
    restart()
    # A set rank 1 removes while rank 0 submits to it.
    pair = hvd.add_process_set([0, 1])
    if RANK == 1:
        hvd.remove_process_set(pair)
        touch("set_removed")
        wait_for("removal_seen", timeout_s=30)
    elif RANK == 0:
        wait_for("set_removed", timeout_s=30)  # was a 0.5 s sleep
        expect_raises(ValueError, "allreduce on a set removed on rank 1", hvd.allreduce,
                      torch.ones(2), name="removed", process_set=pair, within_s=7,
                      contains=["removed on rank(s) [1]"])
        touch("removal_seen")
    restart()
    log("messages: ok")


def body():
    check_init_destroy_loop()
    check_refused_then_retried()
    check_kind_mismatch()
    check_timeout()
    check_ddp_failures()
    check_messages()
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
