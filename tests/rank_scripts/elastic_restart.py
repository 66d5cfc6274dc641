"""A rank killed where the MPI has no ULFM (issue 46): `perseusrun --elastic` starts the
job again and hvd.elastic.run resumes from the last persisted commit. Run by
tests/mpi/test_fault_tolerance.py on the MPICH core, under perseusrun --elastic.

Every rank trains a small linear model with DistributedOptimizer over an
ElasticSampler, committing after every batch inside hvd.elastic.run
(PERSEUS_ELASTIC_PERSIST_INTERVAL says which commits are persisted). PTEST_RESTART_CASE:

  resume   in the first run (PERSEUS_ELASTIC_RESTARTS=0), rank 0 SIGKILLs itself in
           the middle of writing persisted commit PTEST_KILL_COMMIT (half its bytes
           written); the restarted job must resume from the last whole persisted commit
           and finish. Rank 0 logs where each run started ("started at step S epoch E").
           At the end every rank checks, against references it computes: the steps
           and losses of the whole training are there once each, the loss fell, every
           rank holds the same parameters to the bit, and in the epoch of the failure
           no sample the persisted commit had processed was trained again and none
           was skipped.
  always   rank PTEST_VICTIM SIGKILLs itself at step PTEST_KILL_STEP, before the step's
           allreduce (the others are inside it), in every run (the restart limit).
  bad_dir  hvd.elastic.run must refuse PERSEUS_ELASTIC_PERSIST_DIR on every rank.
  grow     under perseusrun --elastic --host-discovery-script (issue 46, point 3):
           PTEST_NEW_HOSTS is a list of host lists separated by ";". In run k while
           the list has a k-th entry, rank 0 writes it into PTEST_HOSTS_FILE (what the
           discovery script prints) PTEST_CHANGE_STEP steps after the run started,
           and the steps slow down (0.25 s) until the ranks see HostsUpdatedInterrupt
           at a commit and stop (exit code 75; each logs "stopped for new hosts after
           step S, size N"). Each next run, on the new hosts, must start at that step
           and run the reset callback once at its size; the last one finishes with
           the checks of `resume`.
"""
import os
import pickle
import signal
import sys
import time

import torch

from common import (assert_trained_alike, elastic_regression, log, main, regression_data, touch,
                    wait_for)

import perseus.torch.horovod as hvd
from perseus.common import elastic
from perseus.common.elastic import PersistError

SAMPLES, FEATURES, BATCH, EPOCHS = 96, 8, 4, 3


class _DieMidWrite:
    """perseus.common.elastic's pickle on rank 0 of the first run: writing commit
    PTEST_KILL_COMMIT, it writes half the bytes, flushes them and SIGKILLs itself."""

    def __getattr__(self, name):
        return getattr(pickle, name)

    def dump(self, record, f, protocol=None):
        data = pickle.dumps(record, protocol=protocol)
        if record["commit"] != int(os.environ["PTEST_KILL_COMMIT"]):
            f.write(data)
            return
        f.write(data[:len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)


def body():
    case = os.environ["PTEST_RESTART_CASE"]
    attempt = int(os.environ["PERSEUS_ELASTIC_RESTARTS"])
    hvd.init()
    if case == "resume" and attempt == 0 and hvd.rank() == 0:
        elastic.pickle = _DieMidWrite()
    changes = os.environ.get("PTEST_NEW_HOSTS", "").split(";") if case == "grow" else []
    changing = attempt < len(changes)  # this run changes the hosts
    x, y = regression_data(SAMPLES, FEATURES)
    model, optimizer, state = elastic_regression(x, y)
    record = {"start": None, "committed": None, "trained": set(), "resets": 0}

    def on_reset():  # Horovod's use: rescale to the new size; here, count and log
        record["resets"] += 1
        if hvd.rank() == 0:
            log("reset callback at size %d, step %d" % (hvd.size(), state.step))

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        if record["start"] is None:
            record["start"] = (state.step, state.epoch)
            record["committed"] = set(state.sampler.processed_indices)
            if hvd.rank() == 0:
                log("run %d started at step %d epoch %d" % (attempt, state.step, state.epoch))
        for state.epoch in range(state.epoch, EPOCHS):
            indices = list(state.sampler)
            for batch in range(-(-len(indices) // BATCH)):
                mine = indices[batch * BATCH:(batch + 1) * BATCH]
                if (case == "always" and hvd.rank() == int(os.environ["PTEST_VICTIM"])
                        and state.step == int(os.environ["PTEST_KILL_STEP"])):
                    os.kill(os.getpid(), signal.SIGKILL)
                if changing and state.step > record["start"][0] + int(
                        os.environ["PTEST_CHANGE_STEP"]):
                    time.sleep(0.25)  # time for perseusrun's discovery to see the change
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x[mine]).squeeze(1), y[mine])
                loss.backward()
                optimizer.step()
                if state.epoch == record["start"][1]:
                    record["trained"].update(mine)
                state.sampler.record_batch(batch, BATCH)
                state.losses.append(hvd.allreduce(loss.detach(), name="loss").item())
                state.step += 1
                if (changing and hvd.rank() == 0 and state.step ==
                        record["start"][0] + int(os.environ["PTEST_CHANGE_STEP"])):
                    with open(os.environ["PTEST_HOSTS_FILE"], "w") as f:
                        f.write(changes[attempt] + "\n")
                state.commit()
            state.sampler.set_epoch(state.epoch + 1)
        return state.losses

    if case == "bad_dir":
        try:
            train(state)
        except PersistError as e:
            log("refused: %s" % e)
            hvd.shutdown()
            return
        raise AssertionError("hvd.elastic.run accepted PERSEUS_ELASTIC_PERSIST_DIR=%s"
                             % os.environ.get("PERSEUS_ELASTIC_PERSIST_DIR"))

    rank, size = hvd.rank(), hvd.size()
    try:
        losses = train(state)
    except SystemExit as e:
        if case != "grow" or e.code != elastic.HOSTS_UPDATED_EXIT:
            raise
        log("stopped for new hosts after step %d, size %d" % (state.step, size))  # shut down
        sys.stdout.flush()
        # No rank leaves before every rank has said so: os._exit skips MPI_Finalize, and
        # hydra kills the other ranks at once when one leaves without it (a line was
        # lost so in CI).
        touch("stopped.%d.%d" % (attempt, rank))
        for other in range(size):
            wait_for("stopped.%d.%d" % (attempt, other))
        os._exit(e.code)
    if case == "grow":
        assert attempt == len(changes) and record["resets"] == 1, (attempt, record["resets"])
        assert state.epoch == EPOCHS - 1 and len(losses) == state.step, (state.epoch,
                                                                          len(losses))
    else:
        steps = EPOCHS * SAMPLES // (BATCH * hvd.size())
        assert state.step == steps and len(losses) == steps, (state.step, len(losses), steps)
    first, last = assert_trained_alike(model, losses, 4)
    trained = set().union(*hvd.allgather_object(record["trained"]))
    repeated = trained & record["committed"]
    assert not repeated, "samples of the persisted commit trained again: %s" % repeated
    skipped = set(range(SAMPLES)) - trained - record["committed"]
    assert not skipped, "samples never trained in the epoch it resumed in: %s" % skipped
    log("restart ok: run %d, size %d, %d steps, loss %.4f -> %.4f"
        % (attempt, hvd.size(), state.step, first, last))
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
