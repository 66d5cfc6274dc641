"""A fork while init() runs (issue 32, point 4): init() finishes, the parent works and
the child refuses Perseus at once.

Open MPI's singleton start (a plain `python`, no mpirun) forks inside MPI_Init_thread
to start its daemon; Perseus's prefork handler used to wait there for the lock that
perseus_init holds on that very thread, so init() hung forever. A preloaded
MPI_Init_thread (tests/shims/mpi_init_fork.c) makes the same fork on any MPI, here
the venv's MPICH, on every run. tests/launch/test_open_mpi.py runs the real Open MPI case.
"""
import sys

from support.jobs import clean_env, run_bounded

# Well above a plain init() (about 2 s with the torch import), well below the shim's
# 20 s wait that the thread test would show if a fork waited for init().
TIMEOUT_S = 60
INIT_BOUND_S = 10

INIT_AND_REDUCE = """
import torch
import perseus.torch.horovod as hvd
hvd.init()
print("SIZE", hvd.size())
print("SUM", hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist())
hvd.shutdown()
"""


def test_init_survives_a_fork_inside_mpi_init(shim, tmp_path):
    mark = tmp_path / "forked"
    env = clean_env({"LD_PRELOAD": shim("mpi_init_fork"), "PTEST_FORK_MARK": str(mark)})
    rc, out, err, seconds = run_bounded([sys.executable, "-c", INIT_AND_REDUCE], env, TIMEOUT_S)
    report = "rc %d after %.1f s\nstdout:\n%s\nstderr:\n%s" % (rc, seconds, out, err)
    assert rc == 0, report
    assert mark.exists(), "the shim did not fork inside MPI_Init_thread\n" + report
    assert out.split("\n")[:2] == ["SIZE 1", "SUM [1.0, 1.0, 1.0]"], report


# Thread B forks while thread A is inside init(), and the child uses Perseus. init()
# (through the shim, as an MPI that waits for a helper process would) waits for that
# child: a fork that waited for init() to finish would stall both for the shim's 20 s.
# The child must refuse at once, without touching the lock A held at the fork.
THREAD_FORKS = """
import os, threading, time
import perseus.torch.horovod as hvd
entered, awaited = os.environ["PTEST_INIT_ENTERED"], os.environ["PTEST_INIT_WAITS_FOR"]

def child():
    try:
        hvd.rank()
        said = "rank() did not raise"
    except ValueError as e:
        said = "ValueError: %s" % e
    with open(awaited + ".tmp", "w") as f:
        f.write(said)
    os.rename(awaited + ".tmp", awaited)

def forker():
    while not os.path.exists(entered):
        time.sleep(0.01)
    pid = os.fork()  # thread A is inside MPI_Init_thread, holding init()'s lock
    if pid == 0:
        child()
        os._exit(0)
    os.waitpid(pid, 0)

thread = threading.Thread(target=forker)
thread.start()
start = time.monotonic()
hvd.init()
print("INIT_S %.1f" % (time.monotonic() - start))
thread.join()
print("CHILD", open(awaited).read())
print("SIZE", hvd.size(), "PID", os.getpid())
hvd.shutdown()
"""


def test_a_fork_on_another_thread_does_not_wait_for_init(shim, tmp_path):
    env = clean_env({"LD_PRELOAD": shim("mpi_init_fork"),
                     "PTEST_INIT_ENTERED": str(tmp_path / "entered"),
                     "PTEST_INIT_WAITS_FOR": str(tmp_path / "child_said")})
    rc, out, err, seconds = run_bounded([sys.executable, "-c", THREAD_FORKS], env, TIMEOUT_S)
    report = "rc %d after %.1f s\nstdout:\n%s\nstderr:\n%s" % (rc, seconds, out, err)
    assert rc == 0, report
    lines = dict(line.split(" ", 1) for line in out.strip().split("\n"))
    assert float(lines["INIT_S"]) < INIT_BOUND_S, report
    pid = lines["SIZE"].split()[-1]
    assert lines["CHILD"].startswith("ValueError: Perseus cannot be used in a process forked "
                                     "after init()"), report
    assert "(pid %s)" % pid in lines["CHILD"], report
    assert lines["SIZE"].split()[0] == "1", report
