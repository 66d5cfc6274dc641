"""A member that stops answering, or stops submitting, while the others wait for it
(driven by tests/mpi/test_failures.py, with small stall times: check T, shutdown S).

PTEST_FROZEN=stop    the last rank stops itself with SIGSTOP after a first allreduce
                     (its pid and the time go to $PTEST_TMPDIR/stopped first). Once
                     /proc shows it stopped, the others submit 'frozen.x': each warns
                     within the check time that it is not responding, and fails at the
                     shutdown time with an error naming it. Each prints "SURVIVOR <rank>
                     ok" and then ends as a training script would, by letting the error
                     propagate, so the exit handlers run; mpirun must then end the job,
                     the stopped rank included (the test checks that).
PTEST_FROZEN=stop_in_collective  the same, but every rank submits 'frozen.x' and the
                     last one stops in its lane as it is about to run it (the core's test
                     hook PERSEUS_TEST_STOP_IN_LANE): the others are left inside the
                     collective, on the thread that runs their engine (the batch runs
                     inline there), and must find it all the same. Rank 1 goes on
                     working for STILL_WORKING_S after its error: the other survivors
                     leave with it, not before (then mpirun would kill it mid-work).
PTEST_FROZEN=stop_ddp  the same as stop, in torch's own DDP over the "perseus" backend:
                     the survivors' backward() raises RuntimeError naming the stopped
                     rank (torch's reducer got a failed future; it crashed with a
                     segfault before, issue 48).
PTEST_FROZEN=native  the last rank blocks in libc's sleep() through ctypes (the GIL
                     released, no Perseus lock held) past the shutdown time; its engine
                     runs. The others warn within the check time that it submitted
                     nothing, and fail at the shutdown time naming it and 'frozen.x'; the
                     sleeper's request, once it wakes, fails at once the same way.

Each waiting rank times the warning with a thread that watches its captured stderr, so
the bound is checked from outside the library: not before T, at most T + WARN_SLACK_S.
"""
import ctypes
import math
import os
import signal
import threading
import time

import torch

from common import hvd, init, launcher_rank_size, main
from support.rank_script import CapturedStderr, announce_victim, wait_for_stop

T = float(os.environ["PERSEUS_STALL_CHECK_TIME_SECONDS"])
S = float(os.environ["PERSEUS_STALL_SHUTDOWN_TIME_SECONDS"])
PROBE = min(T, S) / 4  # the stall inspector's probe interval at these settings
# What a loaded machine may add to a deadline: the engine thread's wake-up and this
# script's polling (every 20 ms). The first warning comes at T (the engine wakes for it,
# with the inspection round already done); the shutdown by S + PROBE.
WARN_SLACK_S = 0.4
EARLY_S = 0.1  # the warning and the error must not come before their time either
STILL_WORKING_S = 2.0  # stop_in_collective: rank 1 at work after the error


class FirstSight(threading.Thread):
    """Notes when `text` first appears in what CapturedStderr captures."""

    def __init__(self, captured, text):
        super().__init__(daemon=True)
        self.captured, self.text, self.seen, self.done = captured, text, None, False
        self.start()

    def run(self):
        fd = self.captured.file.fileno()
        while not self.done and self.seen is None:
            if self.text in os.pread(fd, 1 << 20, 0).decode(errors="replace"):
                self.seen = time.monotonic()
            time.sleep(0.02)


def wait_stalled(want_warning, want_error):
    """Submits 'frozen.x' and waits for the error; checks when the warning and the error
    came, relative to the submission. Returns the error and what went to stderr."""
    start = time.monotonic()
    with CapturedStderr() as err:
        warning = FirstSight(err, want_warning)
        try:
            hvd.allreduce(torch.ones(4), name="frozen.x")
            raise AssertionError("the allreduce returned, with a rank that never submitted it")
        except hvd.HorovodInternalError as e:
            error, failed_s = e, time.monotonic() - start
        time.sleep(0.05)  # the watcher's last look
        warning.done = True
    assert warning.seen is not None, "no warning with %r:\n%s" % (want_warning, err.text)
    warned_s = warning.seen - start
    os.write(1, ("[rank %d] warned after %.2f s, failed after %.2f s\n"
                 % (hvd.rank(), warned_s, failed_s)).encode())
    assert T - EARLY_S <= warned_s <= T + WARN_SLACK_S, \
        "warned %.2f s after submitting; check time %.1f s:\n%s" % (warned_s, T, err.text)
    assert S - EARLY_S <= failed_s <= S + PROBE + WARN_SLACK_S, \
        "failed %.2f s after submitting; shutdown time %.1f s: %s" % (failed_s, S, error)
    for text in want_error:
        assert text in str(error), "%r not in the error: %s" % (text, error)
    return error, err.text


def stop(rank, size, in_collective=False):
    victim = size - 1
    if rank == victim:
        announce_victim()
        if in_collective:
            hvd.allreduce(torch.ones(4), name="frozen.x")  # stops in the lane
        else:
            os.kill(os.getpid(), signal.SIGSTOP)
        raise AssertionError("the stopped rank was continued")
    if not in_collective:
        wait_for_stop()
    named = "rank(s) [%d] not responding (stopped, stuck or unreachable)" % victim
    error, _ = wait_stalled(named, ["at the stall shutdown time", named, "'allreduce.frozen.x'"])
    if in_collective and rank == 1:
        # Still at work after the error (a checkpoint being written) while the other
        # survivors leave: they wait for it (before: the first to leave made mpirun kill
        # it here, and its line never came).
        time.sleep(STILL_WORKING_S)
    os.write(1, ("SURVIVOR %d ok\n" % rank).encode())
    raise error  # ends the script as an unhandled error would: exit handlers run


def stop_ddp():
    import torch.distributed as dist
    import torch.nn as nn

    import perseus.torch  # noqa: F401 - registers the backend
    dist.init_process_group("perseus")
    rank, size = dist.get_rank(), dist.get_world_size()
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
    model(torch.ones(3, 4)).sum().backward()
    if rank == size - 1:
        announce_victim()
        os.kill(os.getpid(), signal.SIGSTOP)
        raise AssertionError("the stopped rank was continued")
    wait_for_stop()
    named = "rank(s) [%d] not responding (stopped, stuck or unreachable)" % (size - 1)
    start = time.monotonic()
    try:
        model(torch.ones(3, 4)).sum().backward()
        raise AssertionError("backward() returned, with a rank that never submitted")
    except RuntimeError as e:
        error = e
    failed_s = time.monotonic() - start
    assert named in str(error) and "at the stall shutdown time" in str(error), error
    assert S - EARLY_S <= failed_s <= S + PROBE + 2 * WARN_SLACK_S, failed_s
    os.write(1, ("SURVIVOR %d ok\n" % rank).encode())
    raise error  # ends the script as an unhandled error would: exit handlers run


def native(rank, size):
    sleeper = size - 1
    if rank == sleeper:
        ctypes.CDLL(None).sleep(int(math.ceil(S + 1.5)))  # ctypes releases the GIL
        start = time.monotonic()
        try:
            hvd.allreduce(torch.ones(4), name="frozen.x")
            raise AssertionError("the allreduce returned after the stall shutdown")
        except hvd.HorovodInternalError as e:
            assert "stalled past the stall shutdown time" in str(e), e
            assert time.monotonic() - start < 2, time.monotonic() - start
        return
    describe = ("'allreduce.frozen.x' (submitted by rank(s) [%s], missing on rank(s) [%d])"
                % (", ".join(str(r) for r in range(size - 1)), sleeper))
    idle = ("Rank(s) with nothing pending, which stopped submitting: %d (last submitted "
            "'allreduce.warm')" % sleeper)
    _, warnings = wait_stalled(describe, ["stalled past the stall shutdown time", describe, idle])
    assert "not responding" not in warnings, warnings  # its engine answers: it is not frozen


def body():
    mode = os.environ["PTEST_FROZEN"]
    if mode == "stop_ddp":
        return stop_ddp()
    if mode == "stop_in_collective" and launcher_rank_size()[0] == launcher_rank_size()[1] - 1:
        os.environ["PERSEUS_TEST_STOP_IN_LANE"] = "allreduce.frozen.x"  # read at the first batch
    rank, size = init()
    hvd.allreduce(torch.ones(4), name="warm")
    if mode == "native":
        native(rank, size)
    else:
        stop(rank, size, in_collective=mode == "stop_in_collective")


if __name__ == "__main__":
    if os.environ["PTEST_FROZEN"] != "native":
        body()  # not main(): the survivors' error must end them through the exit handlers
    else:
        main(body)
