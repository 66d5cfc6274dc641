"""A rank killed in the middle of training, the others going on (issue 46): Horovod's
elastic API unchanged, on Open MPI 5 with ULFM (mpirun --with-ft ulfm), run by
tests/mpi/test_fault_tolerance.py with the core built against that MPI.

Every rank trains a small linear model with DistributedOptimizer over an
ElasticSampler, committing after every batch inside hvd.elastic.run. At step
PTEST_KILL_STEP the victims (PTEST_VICTIMS: world ranks, default the last) SIGKILL
themselves (PTEST_SIGNAL=SIGSTOP: freeze, to be declared failed by the detector and
ended by a survivor; PTEST_SIGNAL=PAUSE: write paused.<rank> to PTEST_TMPDIR and wait
for a file `go` there, then go on, while the test kills or cuts off their host:
tests/launch/test_fault_tolerance_hosts.py) where PTEST_KILL_WHERE says:

  allreduce   just before the step's gradients are reduced (the others are inside it)
  broadcast   inside a broadcast of every rank (its turn to send)
  allgather   inside an allgather
  set         inside an allreduce on a process set of every rank but rank 0 (added
              again after the reset: a set does not outlive its world)
  commit      during state.commit()

PTEST_RECOVERY_VICTIM (a world rank): that rank also dies, SIGKILLed inside the state
sync that follows the first failure (a second failure during recovery).

The survivors must each raise HorovodInternalError (never hang), restore the last
commit, shrink to the survivors (size and ranks change), sync from the new rank 0 and
finish the epochs. At the end each survivor checks, against a reference it computes:
- every survivor holds the same parameters, to the bit;
- the training loss fell;
- no sample was skipped in the epoch of the failure (the survivors' records joined),
  and none that this rank committed as processed before it was trained on again after
  it (as Horovod's, a failed rank's record is lost: its samples are trained again).
Rank 0 of the survivors prints "RECOVERED <size before> -> <size after> in <s>".

PTEST_BUSY="RANK:STEP:SECONDS": world rank RANK computes outside MPI for SECONDS (a
sleep, its engine idle) before step STEP's allreduce, the others waiting inside it: with
Open MPI's heartbeat detector on, the core's heartbeats must keep it from being
declared failed. Each rank logs how the init() sees a frozen rank ("detector: ...").

PTEST_HOLD_AFTER_RESET_S: the survivors wait that long in their reset callback before
they go on (a host lost whole: Open MPI ends the job meanwhile, so the last commit is
the one before the failure, whatever the load).

Restarted by perseusrun (PERSEUS_ELASTIC_RESTARTS above 0: `perseusrun --elastic -H`
under ULFM after Open MPI lost a host whole, tests/launch/test_fault_tolerance_hosts.py):
no rank is lost in this run; hvd.elastic.run resumed from the last persisted commit
(rank 0 logs "run R started at step S epoch E"), and the same checks follow, the
commit's processed samples standing for those committed at the failure. Each rank logs
"restarted ok" instead of "survivor ok". The victims die in the first run only.

Under perseusrun's --min-np (PERSEUS_ELASTIC_MIN_NP) survivors fewer than it stop with
exit code 76 where perseusrun restarts the job (each logs "stopped below --min-np at
step S"), else fail with BelowMinNpError (tests/mpi/test_fault_tolerance.py).
"""
import os
import signal
import time

import torch

from common import (assert_trained_alike, elastic_regression, launcher_rank_size, log, main,
                    regression_data, touch, wait_for)

import perseus.torch.horovod as hvd
from perseus.common import elastic
from perseus.common.basics import fault_tolerance
from support.rank_script import leave_without_teardown

SAMPLES, FEATURES, BATCH, EPOCHS = 96, 8, 4, 2


def restarts():
    return int(os.environ.get("PERSEUS_ELASTIC_RESTARTS") or 0)


def victims():
    return [int(r) for r in os.environ.get("PTEST_VICTIMS", "").split(",") if r] or \
        [launcher_rank_size()[1] - 1]


def recovery_victim():
    value = os.environ.get("PTEST_RECOVERY_VICTIM")
    return None if value is None else int(value)


def die_in_recovery_sync(state, record, world_rank):
    """The recovery victim: its state.sync() after a reset SIGKILLs it as it starts,
    the others being inside the sync's broadcast."""
    original = state.sync

    def sync():
        if record["recovered"] is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        original()

    if world_rank == recovery_victim():
        state.sync = sync


def busy_here(step, world_rank):
    if os.environ.get("PTEST_BUSY"):
        rank, at, seconds = os.environ["PTEST_BUSY"].split(":")
        if world_rank == int(rank) and step == int(at):
            time.sleep(float(seconds))


def die_here_if_victim(where, step, world_rank):
    if (os.environ.get("PTEST_KILL_WHERE") == where and step == int(os.environ["PTEST_KILL_STEP"])
            and world_rank in victims() and not restarts()):  # a restarted job loses none
        if os.environ.get("PTEST_SIGNAL") == "PAUSE":
            touch("paused.%d" % world_rank)
            wait_for("go", timeout_s=120)
            return
        if os.environ.get("PTEST_SIGNAL") == "SIGSTOP":
            with open(os.path.join(os.environ["PTEST_TMPDIR"], "frozen.%d" % world_rank), "w") as f:
                f.write(str(os.getpid()))
        os.kill(os.getpid(), getattr(signal, os.environ.get("PTEST_SIGNAL", "SIGKILL")))
        log("woke up after being declared failed")  # never: a survivor ends it


def still_runs(pid):
    """Whether process `pid` exists and is neither a zombie nor gone (within 5 s)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return False
        except OSError:
            return False
        time.sleep(0.05)
    return True


def body():
    world_rank, world_size = launcher_rank_size()
    restarted = restarts()
    hold_s = float(os.environ.get("PTEST_HOLD_AFTER_RESET_S") or 0)
    hvd.init()
    log("detector: " + fault_tolerance()[1].rpartition("; ")[2])
    x, y = regression_data(SAMPLES, FEATURES)
    model, optimizer, state = elastic_regression(x, y)
    record = {"set": None, "recovered": None, "committed_at_failure": None,
              "epoch_of_failure": None,
              "after_failure": set(), "processed": {}}

    def add_set():
        # Every rank but rank 0: sets other than the global one do not outlive a
        # failure (the world they were made of is gone), so a reset callback adds it again.
        record["set"] = hvd.add_process_set(list(range(1, hvd.size()))) \
            if os.environ.get("PTEST_KILL_WHERE") == "set" else None

    add_set()

    def on_reset():
        if hold_s and not restarted:
            time.sleep(hold_s)  # Open MPI ends the job meanwhile, this process with it
        add_set()
        record["recovered"] = time.monotonic()
        record["epoch_of_failure"] = state.epoch
        record["committed_at_failure"] = set(state.sampler.processed_indices)

    state.register_reset_callbacks([on_reset])
    die_in_recovery_sync(state, record, world_rank)

    @hvd.elastic.run
    def train(state):
        if restarted and record.get("start") is None:
            record["start"] = state.step
            if hvd.rank() == 0:
                log("run %d started at step %d epoch %d" % (restarted, state.step, state.epoch))
        for state.epoch in range(state.epoch, EPOCHS):
            # This epoch's samples not processed yet, split over this world (as
            # Horovod's examples use it: after a reset the batches count from 0).
            indices = list(state.sampler)
            for batch in range(-(-len(indices) // BATCH)):
                mine = indices[batch * BATCH:(batch + 1) * BATCH]
                busy_here(state.step, world_rank)
                die_here_if_victim("allreduce", state.step, world_rank)
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x[mine]).squeeze(1), y[mine])
                loss.backward()
                optimizer.step()
                if os.environ.get("PTEST_KILL_WHERE") == "broadcast":
                    die_here_if_victim("broadcast", state.step, world_rank)
                    hvd.broadcast_object(state.step, root_rank=hvd.size() - 1)
                if os.environ.get("PTEST_KILL_WHERE") == "allgather":
                    die_here_if_victim("allgather", state.step, world_rank)
                    hvd.allgather(torch.tensor([[float(hvd.rank())]]))
                if record["set"] is not None and hvd.rank() != 0:
                    die_here_if_victim("set", state.step, world_rank)
                    total = hvd.allreduce(torch.ones(1), name="set.step", op=hvd.Sum,
                                          process_set=record["set"])
                    assert total.item() == hvd.size() - 1, total
                if record["epoch_of_failure"] == state.epoch:
                    record["after_failure"].update(mine)
                state.sampler.record_batch(batch, BATCH)
                state.losses.append(hvd.allreduce(loss.detach(), name="loss").item())
                state.step += 1
                die_here_if_victim("commit", state.step, world_rank)
                state.commit()
            record["processed"][state.epoch] = set().union(
                *hvd.allgather_object(state.sampler.processed_indices))
            state.sampler.set_epoch(state.epoch + 1)
        return state.losses

    try:
        losses = train(state)
    except SystemExit as e:  # too few survivors (--min-np): perseusrun restarts the job
        if e.code != elastic.BELOW_MIN_NP_EXIT:
            raise
        log("stopped below --min-np at step %d" % state.step)
        leave_without_teardown(e.code)
    assert record["recovered"] is not None, "no failure was recovered from"
    lost = 0 if restarted else len(victims()) + (recovery_victim() is not None)
    assert hvd.size() == world_size - lost, (hvd.size(), world_size)
    assert len(losses) == state.step, (len(losses), state.step)  # each step's loss once
    first, last = assert_trained_alike(model, losses, 4)
    repeated = record["after_failure"] & record["committed_at_failure"]
    assert not repeated, "committed samples trained on again after the failure: %s" % repeated
    skipped = set(range(SAMPLES)) - record["processed"][record["epoch_of_failure"]]
    assert not skipped, "samples never trained on in the epoch of the failure: %s" % skipped
    for name in os.listdir(os.environ["PTEST_TMPDIR"]):  # frozen victims: ended by now
        if name.startswith("frozen."):
            pid = int(open(os.path.join(os.environ["PTEST_TMPDIR"], name)).read())
            assert not still_runs(pid), "frozen rank %s (pid %d) still runs" % (name, pid)
            log("frozen rank %s was ended" % name[len("frozen."):])
    log("%s ok, size %d, loss %.4f -> %.4f" % ("restarted" if restarted else "survivor",
                                               hvd.size(), first, last))
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
