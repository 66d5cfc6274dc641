"""Environment variables under the names the user set.

1. Unknown PERSEUS_*/HOROVOD_* names: init() warns once, on rank 0 only, about each
   one a few edits from a known name, naming that name; not about Horovod's own
   variables that Perseus does not implement (horovodrun's HOROVOD_RANK, ...), nor
   about names far from every known one (other tools' PERSEUS_* variables); not
   again at a second init().
2. A timeline path rank 0 cannot open, set as HOROVOD_TIMELINE: init() fails on every
   rank with an error that names HOROVOD_TIMELINE, the variable the user set.

Each rank captures its own stderr (file descriptor 2, where the core logs) around
init(), and sets the variables itself before init().
"""
import os
import tempfile

from common import captured_stderr, expect_raises, hvd, init, launcher_rank_size, main

TYPOS = {  # set -> the name the warning must suggest
    "PERSEUS_FUSION_THRESOLD": "PERSEUS_FUSION_THRESHOLD",
    "HOROVOD_TIMELIME": "HOROVOD_TIMELINE",
    "perseus_cycle_time": "PERSEUS_CYCLE_TIME",
    "PERSEUS_ALLREDUCE_STREAM": "PERSEUS_ALLREDUCE_STREAMS",
}
QUIET = ["HOROVOD_CPU_OPERATIONS", "HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_LOCAL_SIZE",
         "HOROVOD_CONTROLLER", "HOROVOD_MPI_THREADS_DISABLE", "HOROVOD_WITH_PYTORCH",
         "HOROVOD_AUTOTUNE_LOG", "PERSEUS_TF_PYTHON", "PERSEUS_SKIP_MX"]


def body():
    rank, size = launcher_rank_size()
    for name in TYPOS:
        os.environ[name] = "1"
    for name in QUIET:
        os.environ[name] = "1"
    os.environ["PERSEUS_LOG_LEVEL"] = "warning"

    err = captured_stderr(init)
    if rank == 0:
        for typo, meant in TYPOS.items():
            lines = [line for line in err.splitlines() if typo in line]
            assert len(lines) == 1, "warnings about %s: %r\nstderr:\n%s" % (typo, lines, err)
            assert "did you mean %s?" % meant in lines[0], lines[0]
        for name in QUIET:
            assert name not in err, "%s was warned about:\n%s" % (name, err)
    else:
        assert err == "", "rank %d warned:\n%s" % (rank, err)
    hvd.shutdown()
    err = captured_stderr(init)
    assert err == "", "second init() warned again:\n%s" % err
    hvd.shutdown()
    for name in list(TYPOS) + QUIET:
        del os.environ[name]

    # 2. The timeline's error names the variable as set.
    missing = os.path.join(os.environ["PTEST_TMPDIR"], "no-such-dir", "t.json")  # ours: none can make it
    os.environ["HOROVOD_TIMELINE"] = missing
    expect_raises(ValueError, "bad HOROVOD_TIMELINE", hvd.init,
                  contains=["HOROVOD_TIMELINE", "t.json"],
                  within_s=30)
    del os.environ["HOROVOD_TIMELINE"]
    init()
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
