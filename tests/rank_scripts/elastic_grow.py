"""Growing in place (issue 46, point 3) on Open MPI 5 with ULFM: run by
tests/mpi/test_grow_in_place.py under perseusrun --elastic --host-discovery-script.

The job starts on 2 ranks (the discovery script prints localhost:2) and trains a small
linear model with DistributedOptimizer over an ElasticSampler inside hvd.elastic.run,
committing after every step. PTEST_SIZES lists the sizes to grow (or shrink) to, in
order (default "4"): PTEST_CHANGE_STEP steps after the job reached its size, rank 0
writes the next one, localhost:<size>, into PTEST_HOSTS_FILE (what the script prints),
and its steps slow down (0.25 s) until the job has it: every rank must see
HostsUpdatedInterrupt at the same commit, the running processes must go on (each logs
its pid at the start and the end), new processes join (hvd.elastic.run spawns them
with this command line) and get rank 0's state; in a shrink the highest ranks leave
(their process ends inside hvd.elastic.run). At the end every rank checks, against references it computes: the
last size, all on this host, the oldest ranks first; the parameters identical to the bit
on every rank and the loss fallen; every rank at the same step; the reset callback run
once per grow after the process started (never on the newest ones).

PTEST_GROWN_HOSTS (host:slots,... ; tests/launch/test_grow_across_hosts.py, on the
namespace hosts): what rank 0 writes for the last size instead of localhost:<size>, one
host a line; the ranks are then checked to run on the hosts perseusrun's plan gives them
(filled in order), with their local ranks and sizes there. PTEST_JOINED_FROM (default 2):
the first rank that a grow started, once grown.

PTEST_VICTIM_STEP (a job started on 3 ranks): rank 2 SIGKILLs itself at that step; the
two others shrink in place (ULFM) and go on, and the grows start from them. With
PTEST_VICTIM_JOINED=1 the victim is instead the last rank, one a grow spawned, at that
step after the last grow: Open MPI ends the job, and perseusrun restarts it from the
last persisted commit at the grown size.

PTEST_DIE_IN_GROW=spawn|merge (rank 1) or child (the last new process) sets the core's
hook PERSEUS_TEST_DIE_IN_GROW: that process is SIGKILLed during the grow, the others
leave it (exit 75) and perseusrun restarts the job at the grown size from the commit
persisted before it; the same checks then hold on the restarted ranks.
"""
import os
import signal
import socket
import time

from common import (assert_trained_alike, elastic_regression, log, main, regression_data,
                    train_batch)
from support.rank_script import leave_without_teardown

import perseus.common.elastic as elastic

import perseus.torch.horovod as hvd
from perseus.common import basics

SAMPLES, FEATURES, BATCH, EPOCHS = 96, 8, 4, 3
SIZES = [int(n) for n in os.environ.get("PTEST_SIZES", "4").split(",")]
GROWN = SIZES[-1]
GROWN_HOSTS = [h for h in os.environ.get("PTEST_GROWN_HOSTS", "").split(",") if h]
# The first rank of the grown job that a grow started (after a shrink and a grow at once,
# the ranks that stayed come first, however many).
JOINED_FROM = int(os.environ.get("PTEST_JOINED_FROM", "2"))


def hosts_text(size):
    """What the discovery script prints for `size` ranks."""
    if size == GROWN and GROWN_HOSTS:
        return "".join(h + "\n" for h in GROWN_HOSTS)
    return "localhost:%d\n" % size


def expected_place(rank):
    """(host, local rank, local size) of `rank` in the grown job: perseusrun's plan fills
    the hosts in order; None for localhost."""
    if not GROWN_HOSTS:
        return None, rank, GROWN
    first = 0
    for host, _, slots in (h.partition(":") for h in GROWN_HOSTS):
        count = min(int(slots), GROWN - first)
        if rank < first + count:
            return host, rank - first, count
        first += count
    raise AssertionError("rank %d beyond the hosts %s" % (rank, GROWN_HOSTS))


def body():
    die_in_grow = os.environ.get("PTEST_DIE_IN_GROW", "")
    if die_in_grow == "child":  # the core's hook acts only in the spawned processes
        os.environ["PERSEUS_TEST_DIE_IN_GROW"] = "child"
    hvd.init()
    joined = basics.joined_job()
    if die_in_grow in ("spawn", "merge") and hvd.rank() == 1 and not joined:
        os.environ["PERSEUS_TEST_DIE_IN_GROW"] = die_in_grow  # read at the grow
    log("grow-start rank %d size %d pid %d joined %d host %s" % (
        hvd.rank(), hvd.size(), os.getpid(), joined, socket.gethostname()))
    change = int(os.environ["PTEST_CHANGE_STEP"])
    victim_step = int(os.environ.get("PTEST_VICTIM_STEP", "0"))
    victim_joined = os.environ.get("PTEST_VICTIM_JOINED") == "1"
    first_size = hvd.size()
    # Rank 0's (never a process that joined: the old ranks keep theirs): the sizes still
    # to reach, in order. A restarted job (a change that took the restart, the last one
    # in these tests) has none left.
    restarted = int(os.environ.get("PERSEUS_ELASTIC_RESTARTS", "0")) > 0
    targets = [] if joined or restarted else [n for n in SIZES]
    x, y = regression_data(SAMPLES, FEATURES)
    model, optimizer, state = elastic_regression(x, y)
    record = {"resets": 0, "start": None, "grown_at": 0}  # the step the size was reached

    def reached():
        while targets and hvd.size() == targets[0]:
            targets.pop(0)

    def on_reset():
        record["resets"] += 1
        reached()
        record["grown_at"] = state.step
        log("reset callback rank %d size %d step %d" % (hvd.rank(), hvd.size(), state.step))

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        if record["start"] is None:
            record["start"] = record["grown_at"] = state.step
            if joined:
                log("joined rank %d size %d at step %d" % (hvd.rank(), hvd.size(), state.step))
        for state.epoch in range(state.epoch, EPOCHS):
            indices = list(state.sampler)
            for batch in range(-(-len(indices) // BATCH)):
                mine = indices[batch * BATCH:(batch + 1) * BATCH]
                if victim_step and state.step == victim_step and hvd.rank() == 2 and not joined \
                        and not victim_joined:
                    os.kill(os.getpid(), signal.SIGKILL)
                if (victim_joined and joined and hvd.rank() == GROWN - 1
                        and state.step == record["start"] + victim_step):
                    os.kill(os.getpid(), signal.SIGKILL)
                if hvd.rank() == 0 and targets and state.step > record["grown_at"] + change:
                    time.sleep(0.25)  # time for perseusrun's discovery to see the change
                train_batch(model, optimizer, state, x, y, mine, batch, BATCH)
                if hvd.rank() == 0 and targets and state.step == record["grown_at"] + change:
                    with open(os.environ["PTEST_HOSTS_FILE"], "w") as f:
                        f.write(hosts_text(targets[0]))
                state.commit()
            state.sampler.set_epoch(state.epoch + 1)
        return state.losses

    try:
        losses = train(state)
    except SystemExit as e:  # perseusrun starts the job again (a change, or a failure once grown)
        if e.code not in (elastic.HOSTS_UPDATED_EXIT, elastic.GROWN_JOB_FAILED_EXIT):
            raise
        log("stopped for the restart at step %d" % state.step)
        leave_without_teardown(e.code)  # Perseus's exit, MPI_Finalize, then the code
    assert hvd.size() == GROWN, hvd.size()
    host, local_rank, local_size = expected_place(hvd.rank())
    assert host in (None, socket.gethostname()), (hvd.rank(), host, socket.gethostname())
    assert (hvd.local_rank(), hvd.local_size()) == (local_rank, local_size), (
        hvd.local_rank(), hvd.local_size(), local_rank, local_size)
    # After a grow that failed, perseusrun restarted the job on the new size (no process
    # joined; the reset callback ran once, at the resume from the persisted commit).
    assert joined == (hvd.rank() >= JOINED_FROM and not restarted), (joined, hvd.rank(), restarted)
    # Each change of size after this process started: all of them for the old ranks, those
    # after the size it joined at for a new one.
    changes = len(SIZES) - (SIZES.index(first_size) + 1 if joined else 0)
    resets = 1 if restarted else changes + (1 if victim_step and not joined else 0)
    assert record["resets"] == resets, (record["resets"], resets)
    steps = hvd.allgather_object(state.step)
    assert steps == [state.step] * GROWN and len(losses) == state.step, (steps, len(losses))
    first, last = assert_trained_alike(model, losses, 4)
    log("grow-end rank %d size %d local %d/%d pid %d joined %d steps %d loss %.4f -> %.4f "
        "host %s" % (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), os.getpid(),
                     joined, state.step, first, last, socket.gethostname()))
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
