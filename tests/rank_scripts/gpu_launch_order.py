"""Device lanes that cannot deadlock each other (issue 36): on the fake GPU whose device
model (tests/gpu_fakes/fake_device.c) gives each GPU FAKE_GPU_KERNEL_SLOTS=1 (an NCCL
kernel fills it until every peer has started the same kernel), steps of mixed batches
run on 4 lanes (PERSEUS_ALLREDUCE_STREAMS=4). Each step is one call of requests of
several dtypes and sizes, so the fusion planner makes several batches of one round,
one per lane; FAKE_GPU_LAUNCH_JITTER_US delays each launch by a different time on each
rank, so lanes finish their host work in different orders on different ranks. Unless
every rank launches its device collectives in one agreed order, two ranks launch two
lanes' kernels in opposite orders and the fake reports the wait-for cycle (the batch
fails naming it). Every result is checked against the sum computed here.

LAUNCH_ORDER_SETS="0,1,2;1,2,3" adds these process sets: each step then also spreads
requests over them, all of a rank's requests of a step in one submission, so the
batches of sets that share ranks are in flight at once, each set negotiated on its
own. FAKE_GPU_WAIT_JITTER_US delays each lane's wait for its inputs, which comes
before its launch turn, so the sets' lanes reach their launches in different orders
on different ranks: unless the ranks also agree one order across sets, two sets'
kernels deadlock the GPU of one slot.

LAUNCH_ORDER_STOP=1 (np 3, LAUNCH_ORDER_SETS="0,1", small stall times T and S): after
the steps, rank 2 stops itself with SIGSTOP (its pid goes to $PTEST_TMPDIR/stopped), and
ranks 0 and 1 allreduce on the GPU in their set. Every rank takes part in the rounds
that order launches across sets, so the batch waits for rank 2: the global set's stall
inspector must name it (a warning at T) and give it up at S, after which the batch
launches in its set's order and completes. Each survivor prints "SURVIVOR <rank> ok";
then rank 0 kills the stopped rank, which ends the job.
"""
import os
import signal
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import capi  # noqa: E402
from support import fake_gpu  # noqa: E402
from support.capi import ALLREDUCE, BROADCAST  # noqa: E402
from support.rank_script import CapturedStderr, announce_victim, log, main, victim_file, wait_for_stop  # noqa: E402

STEPS = int(os.environ.get("LAUNCH_ORDER_STEPS", "8"))
DTYPES = [np.float32, np.int32, np.float16, np.int64]


def set_ranks(size):
    """LAUNCH_ORDER_SETS: the added process sets' ranks, e.g. "0,1,2;1,2,3"."""
    text = os.environ.get("LAUNCH_ORDER_SETS", "")
    sets = [sorted(int(r) for r in part.split(",")) for part in text.split(";") if part.strip()]
    assert all(0 <= r < size for ranks in sets for r in ranks), (text, size)
    return sets


def step_plan(step, set_index):
    """The same requests of one set on each of its members: (kind, name, shape, dtype, draw)."""
    seed = b"launch-order|%d" % step if set_index == 0 else b"launch-order|%d|%d" % (step, set_index)
    rng = np.random.default_rng(zlib.crc32(seed))
    plan = []
    for i in range(int(rng.integers(5, 10))):
        size = int(rng.choice([1, 17, 700, 3000, 9000, 20000, 40000]))
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        kind = BROADCAST if rng.random() < 0.25 else ALLREDUCE
        plan.append((kind, "lo.%d.%d.%d" % (set_index, step, i), (size,), dtype, int(rng.integers(0, 64))))
    return plan


def set_requests(rank, set_id, members, plan):
    """This rank's requests of one set's plan and their expected results."""
    requests, expected = [], []
    for kind, name, shape, dtype, draw in plan:
        x = capi.make(name, rank, shape, dtype, low=-3, high=3)
        if kind == ALLREDUCE:
            want = sum(capi.make(name, r, shape, dtype, low=-3, high=3).astype(np.int64) for r in members)
            requests.append(capi.request(ALLREDUCE, name, x, device=0, process_set=set_id))
        else:
            root = draw % len(members)  # the C ABI's root is a rank in the set
            want = capi.make(name, members[root], shape, dtype, low=-3, high=3)
            requests.append(capi.request(BROADCAST, name, x, device=0, root=root, process_set=set_id))
        expected.append((name, np.asarray(want).astype(dtype)))
    return requests, expected


def body():
    rank, size = capi.init()
    assert "PERSEUS_ALLREDUCE_STREAMS=4" in capi.config(), capi.config()
    # With sets: a step of the global set is in flight across add_process_set, so that its
    # batches agreed before the order across sets begins launch ungated, before the rest.
    early = []
    if set_ranks(size):
        requests, expected = set_requests(rank, 0, list(range(size)), step_plan(-1, 0))
        early = list(zip(expected, capi.submit(*requests)))
    sets = [(0, list(range(size)))] + [(capi.add_process_set(ranks), ranks) for ranks in set_ranks(size)]
    mine = [(index, set_id, members) for index, (set_id, members) in enumerate(sets) if rank in members]
    for step in range(STEPS):
        requests, expected = [], []
        for index, set_id, members in mine:
            more, want = set_requests(rank, set_id, members, step_plan(step, index))
            requests += more
            expected += want
        for (name, want), pending in zip(expected, capi.submit(*requests)):
            out = pending.value()
            assert np.array_equal(out, want), "step %d, %s: got %r, expected %r" % (step, name, out[:8], want[:8])
    for (name, want), pending in early:
        assert np.array_equal(pending.value(), want), name
    if os.environ.get("LAUNCH_ORDER_STOP"):
        stop_outside_the_set(rank, sets[1][0])
    capi.shutdown()
    stats = fake_gpu.stats()
    log("fake GPU:", stats)
    assert stats["misuses"] == 0, stats
    assert stats["nccl_calls"] >= STEPS * len(mine) and stats["comms_created"] == 4 * len(mine), stats


def stop_outside_the_set(rank, set_id):
    """LAUNCH_ORDER_STOP: rank 2, in no set but the global one, stops; the others' GPU
    allreduce in set {0, 1} completes once the stall inspector gives rank 2 up."""
    S = float(os.environ["PERSEUS_STALL_SHUTDOWN_TIME_SECONDS"])
    if rank == 2:
        announce_victim()
        os.kill(os.getpid(), signal.SIGSTOP)
        raise AssertionError("the stopped rank was continued")
    pid = wait_for_stop()
    x = capi.make("stopped.x", rank, (3000,), np.float32, low=-3, high=3)
    want = sum(capi.make("stopped.x", r, (3000,), np.float32, low=-3, high=3) for r in (0, 1))
    start = time.monotonic()
    with CapturedStderr() as err:
        (pending,) = capi.submit(capi.request(ALLREDUCE, "stopped.x", x, device=0, process_set=set_id))
        out = pending.value()
        took = time.monotonic() - start
    log("the set's allreduce completed after %.2f s" % took)
    assert np.array_equal(out, want), (out[:8], want[:8])
    assert "rank(s) [2] not responding" in err.text, err.text
    assert S - 0.1 <= took <= S + 5, "completed after %.2f s; stall shutdown time %.1f s" % (took, S)
    sys.stdout.write("SURVIVOR %d ok\n" % rank)
    sys.stdout.flush()
    open(victim_file() + ".survivor%d" % rank, "w").close()
    # Neither leaves before both have said so: with rank 2 given up they leave without
    # MPI_Finalize, and hydra then kills the other ranks at once (rank 0's line was lost
    # so in CI).
    while not os.path.exists(victim_file() + ".survivor%d" % (1 - rank)):
        time.sleep(0.01)
    if rank == 0:
        os.kill(pid, signal.SIGKILL)
    os._exit(0)  # MPI_Finalize would wait for the stopped rank


if __name__ == "__main__":
    main(body)
