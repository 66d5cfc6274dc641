"""A child forked after init() exits cleanly, through the normal exit path (atexit
hooks and all), and any Perseus call in it raises a clear error; the parent keeps
working. Before, the child's exit handler joined engine threads that exist only in
the parent, and the parent hung waiting for the child.
"""
import faulthandler
import os
import time

import torch

from common import assert_reduced, expect_raises, hvd, init, main, make_tensor

CHILD_TIMEOUT_S = 30


def child():
    """Runs in the forked child, which then returns from body() and leaves through
    main()'s sys.exit(0); its exit code tells the parent what went wrong."""
    try:
        assert not hvd.is_initialized()
        for what, call in (("rank()", hvd.rank),
                           ("allreduce", lambda: hvd.allreduce(torch.ones(2), name="in.child")),
                           ("init()", hvd.init)):
            expect_raises(ValueError, "%s in a forked child" % what, call,
                          contains=("forked", "pid %d" % os.getppid()), within_s=5)
        hvd.shutdown()  # a no-op, like any shutdown() after the last
    except BaseException as e:
        print("CHILD FAILED: %r" % (e,), flush=True)
        os._exit(3)


def wait_child(pid):
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    raise AssertionError("the forked child did not exit within %d s" % CHILD_TIMEOUT_S)


def body():
    rank, size = init()
    for step in range(2):  # fork after init, then again after more traffic
        name = "fork.%d" % step
        xs = [make_tensor(name, r, (5, 3), torch.float32) for r in range(size)]
        handle = hvd.allreduce_async(xs[rank], name=name, op=hvd.Sum)  # in flight at the fork
        # The hang dump's watchdog thread (rank_script) would not exist in the child,
        # whose interpreter waits for it at exit: stop it across the fork.
        faulthandler.cancel_dump_traceback_later()
        pid = os.fork()
        if pid != 0 and "PTEST_HANG_DUMP_S" in os.environ:
            faulthandler.dump_traceback_later(float(os.environ["PTEST_HANG_DUMP_S"]), exit=False)
        if pid == 0:
            child()
            return  # the ordinary exit: Python's atexit hooks, then the core's
        code = wait_child(pid)
        assert code == 0, "the forked child exited with %s" % code
        assert_reduced(hvd.synchronize(handle), xs, hvd.Sum, torch.float32, name)
    xs = [make_tensor("after", r, (7,), torch.float64) for r in range(size)]
    assert_reduced(hvd.allreduce(xs[rank], name="after", op=hvd.Sum), xs, hvd.Sum, torch.float64,
                   "allreduce after the forks")
    hvd.shutdown()


main(body, teardown=True)  # the child's subject: the ordinary exit, teardown and all
