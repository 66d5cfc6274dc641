"""A rank SIGKILLed while the others are inside init() or shutdown() (issue 46), on Open
MPI 5 with ULFM (mpirun --with-ft ulfm), run by tests/mpi/test_fault_tolerance_edges.py
with the core built against that MPI. PTEST_EDGE says where:

  mpi_start world rank 3 SIGKILLs itself just before hvd.init(), the others inside
            MPI's start-up (MPI_Init_thread), which Open MPI cannot finish without it:
            they must leave, with exit code 1, at the peer timeout (the test sets it).
  init      world rank 3 SIGKILLs itself inside hvd.init() once its MPI started (the
            core's hook PERSEUS_TEST_DIE_IN_INIT=start), the others forming the world:
            their init() completes on the three survivors, and they train.
  shutdown  after training, world rank 3 waits until every other rank is about to call
            hvd.shutdown(), then SIGKILLs itself: the others' shutdown() returns and they
            leave.
  finalize  world rank 3 SIGKILLs itself once every rank's shutdown() returned: the
            others are leaving (MPI_Finalize, at exit), which must not wait for it.
  reinit    world rank 3 dies just before step 3's allreduce (the others inside it);
            world rank 2 then dies inside the re-init that follows, once the shrunk
            world is made (PERSEUS_TEST_DIE_IN_INIT=world), the others going on with it:
            the re-init completes on ranks 0 and 1, and they train on.

Training is hvd.elastic.run over a small linear model, a commit after every batch. Each
survivor checks: the world's size is what remains, every survivor holds the same
parameters to the bit, the loss fell. It then prints "edge survivor ok, size N".
"""
import os
import signal
import time

from common import (assert_trained_alike, elastic_regression, launcher_rank_size, log, main,
                    regression_data, train_batch)

import perseus.common.basics as basics
import perseus.torch.horovod as hvd

SAMPLES, FEATURES, BATCH, EPOCHS = 48, 8, 4, 2
VICTIM, REINIT_VICTIM, FIRST_KILL_STEP = 3, 2, 3


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def die_in_reinit():
    """The re-init victim: in the reset's init() (hvd.elastic's reset calls
    basics.init), the core's hook SIGKILLs it once the survivors' world is made, the
    others going on to form the world with it."""
    original = basics.init

    def init(*args, **kwargs):
        os.environ["PERSEUS_TEST_DIE_IN_INIT"] = "world"
        return original(*args, **kwargs)

    basics.init = init


def mark(name):
    with open(os.path.join(os.environ["PTEST_TMPDIR"], name), "w") as f:
        f.write(str(os.getpid()))


def wait_for_marks(names, within_s=30):
    deadline = time.monotonic() + within_s
    while not all(os.path.exists(os.path.join(os.environ["PTEST_TMPDIR"], n)) for n in names):
        assert time.monotonic() < deadline, "the others never came: %s" % names
        time.sleep(0.005)


def body():
    world_rank, world_size = launcher_rank_size()
    edge = os.environ["PTEST_EDGE"]
    if edge == "mpi_start" and world_rank == VICTIM:
        die()
    if edge == "init" and world_rank == VICTIM:
        os.environ["PERSEUS_TEST_DIE_IN_INIT"] = "start"
    start = time.monotonic()
    hvd.init()
    if edge == "reinit" and world_rank == REINIT_VICTIM:
        die_in_reinit()
    log("init done in %.1f s, size %d" % (time.monotonic() - start, hvd.size()))
    x, y = regression_data(SAMPLES, FEATURES)
    model, optimizer, state = elastic_regression(x, y)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, EPOCHS):
            indices = list(state.sampler)
            for batch in range(-(-len(indices) // BATCH)):
                mine = indices[batch * BATCH:(batch + 1) * BATCH]
                if edge == "reinit" and world_rank == VICTIM and state.step == FIRST_KILL_STEP:
                    die()
                train_batch(model, optimizer, state, x, y, mine, batch, BATCH)
                state.commit()
            state.sampler.set_epoch(state.epoch + 1)
        return state.losses

    losses = train(state)
    lost = {"init": 1, "shutdown": 0, "finalize": 0, "reinit": 2}[edge]
    assert hvd.size() == world_size - lost, (hvd.size(), world_size)
    first, last = assert_trained_alike(model, losses, 3)
    others = ["%s.%d" % (edge, r) for r in range(world_size) if r != VICTIM]
    if edge == "shutdown":
        if world_rank == VICTIM:
            wait_for_marks(others)
            die()
        mark("shutdown.%d" % world_rank)
    start = time.monotonic()
    hvd.shutdown()
    if edge == "finalize":
        if world_rank == VICTIM:
            wait_for_marks(others)
            die()
        mark("finalize.%d" % world_rank)
    log("edge survivor ok, size %d, loss %.4f -> %.4f, shutdown in %.1f s"
        % (world_size - lost - (edge in ("shutdown", "finalize")), first, last,
           time.monotonic() - start))


if __name__ == "__main__":
    main(body)
