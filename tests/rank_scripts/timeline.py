"""The timeline (run by tests/mpi/test_timeline.py at np 2, two lanes, tiny fusion buffers).

1. HOROVOD_TIMELINE with mark cycles, set per rank before init(): only rank 0's file
   appears; while training runs it parses as an unterminated JSON array (a copy is
   left as running.json for the summary test); after shutdown() it is closed JSON.
   The events: one named track per tensor; NEGOTIATE_<OP>, QUEUED, <OP> (lane id,
   bytes) in that order; MEMCPY_IN/OUT_FUSION_BUFFER inside fused ALLREDUCE spans;
   both lanes used; a process set's tensors under its own pid; cycle markers.
2. start_timeline()/stop_timeline() after a fresh init(): no cycle markers unless
   asked; a second start_timeline() replaces the first file's writer and closes it.
3. start_timeline() is collective: a path rank 0 cannot open, or a file it cannot
   write (/dev/full), fails the call on every rank with rank 0's error. A write error
   later on (a file size limit on rank 0) stops the timeline with exactly one warning
   on rank 0; training goes on, and the next start_timeline() works.
"""
import json
import os
import resource
import shutil
import signal
import time

import torch

from common import captured_stderr, expect_raises, hvd, init, log, main, touch, wait_for

EXECUTE = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER"}


def parse(path, closed):
    """The events of a timeline file; `closed`: it must also be strict JSON."""
    with open(path) as f:
        text = f.read()
    assert text.startswith("[\n"), "%s: starts with %r" % (path, text[:20])
    if closed:
        return json.loads(text)
    assert not text.rstrip().endswith("]"), "%s is closed while the timeline runs" % path
    # Chrome's trace format: an array whose closing bracket may be missing.
    assert text.endswith(",\n") or text == "[\n", "%s ends mid-event: %r" % (path, text[-40:])
    return json.loads(text.rstrip().rstrip(",") + "]")


def workload(rank, size, tag, process_set=None):
    """A little of everything, with names tagged so each phase's tensors differ."""
    group = [torch.ones(3) * (i + 1) for i in range(4)]  # 12-byte tensors: several per buffer
    out = hvd.grouped_allreduce(group, name="%s.fused" % tag, op=hvd.Sum)
    assert torch.equal(out[3], torch.full((3,), 4.0 * size))
    handles = [hvd.allreduce_async(torch.ones(64) * rank, name="%s.ar%d" % (tag, i), op=hvd.Sum)
               for i in range(6)]
    for h in handles:
        assert torch.equal(hvd.synchronize(h), torch.full((64,), float(sum(range(size)))))
    assert torch.equal(hvd.broadcast(torch.ones(5) * rank, 1, name="%s.bc" % tag), torch.ones(5))
    assert hvd.allgather(torch.ones(2, 3), name="%s.ag" % tag).shape == (2 * size, 3)
    assert hvd.alltoall(torch.ones(size, 2), name="%s.a2a" % tag).shape == (size, 2)
    assert hvd.reducescatter(torch.ones(size * 2), name="%s.rs" % tag, op=hvd.Sum).shape == (2,)
    if process_set is not None and rank == 0:
        out = hvd.allreduce(torch.ones(7), name="%s.solo" % tag, op=hvd.Sum, process_set=process_set)
        assert torch.equal(out, torch.ones(7))


def tracks(events):
    names = {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "thread_name":
            key = (e["pid"], e["tid"])
            assert key not in names, "track %s named twice" % (key,)
            names[key] = e["args"]["name"]
    return names


def check_events(events, tag, mark_cycles, expect_solo):
    names = tracks(events)
    by_track = {}
    for e in events:
        if e["ph"] in ("X", "i") and e["name"] != "TIMELINE_STOP":
            assert (e["pid"], e["tid"]) in names, "event on an unnamed track: %s" % e
            by_track.setdefault(names[(e["pid"], e["tid"])], []).append(e)
    per_set = {(pid, name) for (pid, _), name in names.items()}
    assert len(per_set) == len(names), "a tensor has two tracks in one process set"
    wanted = ["allreduce.%s.fused.%d" % (tag, i) for i in range(4)]
    wanted += ["allreduce.%s.ar%d" % (tag, i) for i in range(6)]
    wanted += ["%s.%s.%s" % (op, tag, short) for op, short in
               [("broadcast", "bc"), ("allgather", "ag"), ("alltoall", "a2a"), ("reducescatter", "rs")]]
    lanes = set()
    for tensor in wanted:
        spans = by_track.get(tensor)
        assert spans, "no track for %s; tracks: %s" % (tensor, sorted(set(names.values())))
        op = tensor.split(".")[0].upper()
        got = [s["name"] for s in spans]
        for activity in ("NEGOTIATE_" + op, "QUEUED", op):
            assert got.count(activity) == 1, "%s: %s x%d in %s" % (tensor, activity, got.count(activity), got)
        span = {s["name"]: s for s in spans}
        negotiate, queued, execute = span["NEGOTIATE_" + op], span["QUEUED"], span[op]
        assert negotiate["ts"] + negotiate["dur"] <= queued["ts"] + 0.001, (tensor, negotiate, queued)
        assert queued["ts"] + queued["dur"] <= execute["ts"] + 0.001, (tensor, queued, execute)
        assert execute["args"]["lane"] in (0, 1), execute
        assert queued["args"]["lane"] == execute["args"]["lane"], (queued, execute)
        assert execute["args"]["bytes"] > 0, execute
        lanes.add(execute["args"]["lane"])
        if ".fused." in tensor:
            assert execute["args"]["fused"] > 1, "%s was not fused: %s" % (tensor, execute)
            for copy in ("MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"):
                inner = [s for s in spans if s["name"] == copy]
                assert inner, "%s: no %s in %s" % (tensor, copy, got)
                for s in inner:  # nested inside the collective's span
                    assert execute["ts"] <= s["ts"] and \
                        s["ts"] + s["dur"] <= execute["ts"] + execute["dur"] + 0.001, (s, execute)
    assert lanes == {0, 1}, "expected both lanes in use, got %s" % lanes
    assert by_track["allreduce.%s.ar0" % tag][0]["pid"] == 0
    if expect_solo:
        solo = by_track.get("allreduce.%s.solo" % tag)
        assert solo and all(s["pid"] != 0 for s in solo), "process set track: %s" % solo
    cycles = [e for e in events if e["name"] == "CYCLE_START"]
    if mark_cycles:
        assert len(cycles) >= 5 and all(e["ph"] == "i" for e in cycles), cycles[:3]
    else:
        assert not cycles, "cycle markers without mark_cycles: %s" % cycles[:3]


def body():
    scratch = os.environ["PTEST_TMPDIR"]
    launcher_rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    path = lambda name, r=launcher_rank: os.path.join(scratch, "%s-rank%d.json" % (name, r))

    # 1. From the environment (Horovod's spelling), cycles marked.
    os.environ["HOROVOD_TIMELINE"] = path("env")
    os.environ["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
    rank, size = init()
    assert hvd.config()["PERSEUS_TIMELINE"] == path("env"), hvd.config()
    solo = hvd.add_process_set([0])
    workload(rank, size, "env", solo)
    if rank == 0:
        time.sleep(0.4)  # past the writer's flush interval
        check_events(parse(path("env"), closed=False), "env", True, True)
        shutil.copy(path("env"), os.path.join(scratch, "running.json"))
    hvd.barrier()
    hvd.shutdown()
    del os.environ["HOROVOD_TIMELINE"], os.environ["HOROVOD_TIMELINE_MARK_CYCLES"]
    touch("env-done-%d" % rank)
    for r in range(size):
        wait_for("env-done-%d" % r)
    for r in range(1, size):
        assert not os.path.exists(path("env", r)), "rank %d wrote a timeline" % r
    if rank == 0:
        check_events(parse(path("env"), closed=True), "env", True, True)
        shutil.copy(path("env"), os.path.join(scratch, "closed.json"))

    # 2. From the API, after a fresh init().
    init()
    hvd.start_timeline(path("api"))
    workload(rank, size, "api")
    hvd.stop_timeline()
    hvd.stop_timeline()  # a second stop is harmless
    hvd.start_timeline(path("first"), mark_cycles=True)
    hvd.allreduce(torch.ones(2), name="before.replace")
    hvd.start_timeline(path("second"), mark_cycles=True)  # closes "first"
    workload(rank, size, "second")
    hvd.barrier()
    hvd.shutdown()  # closes "second"
    if rank == 0:
        check_events(parse(path("api"), closed=True), "api", False, False)
        first = parse(path("first"), closed=True)
        assert "allreduce.before.replace" in tracks(first).values(), tracks(first)
        check_events(parse(path("second"), closed=True), "second", True, False)
    else:
        for name in ("api", "first", "second"):
            assert not os.path.exists(path(name)), "rank %d wrote %s" % (rank, name)
    check_errors(rank, size, path)
    log("timeline checks passed")


def check_errors(rank, size, path):
    init()
    # Each rank passes its own path: rank 0's is the one opened, and reported.
    missing = lambda r: os.path.join(os.path.dirname(path("x")), "no-such-dir", "t%d.json" % r)
    expect_raises(ValueError, "a folder rank 0 lacks", hvd.start_timeline, missing(rank),
                  contains=("rank 0: cannot open timeline file '%s': No such file or directory"
                            % missing(0),), within_s=30)
    expect_raises(ValueError, "/dev/full", hvd.start_timeline, "/dev/full",
                  contains=("rank 0: cannot write timeline file '/dev/full': No space left on "
                            "device",), within_s=30)

    limit = 8192  # bytes rank 0 may write to a file: a few flushes of the workload's events
    hvd.start_timeline(path("limited"))

    def run_out_of_space():
        if rank == 0:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        try:
            for i in range(4):
                workload(rank, size, "limited%d" % i)
                time.sleep(0.3)  # past the writer's flush interval
        finally:
            if rank == 0:
                resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    err = captured_stderr(run_out_of_space)
    warned = [line for line in err.splitlines() if "timeline" in line]
    if rank == 0:
        assert len(warned) == 1, "expected one warning, got:\n%s" % err
        assert ("cannot write timeline file '%s': File too large; the timeline stops here"
                % path("limited")) in warned[0], warned[0]
        size_then = os.path.getsize(path("limited"))
        assert 0 < size_then <= limit, size_then
    else:
        assert not warned, "rank %d warned:\n%s" % (rank, err)
    workload(rank, size, "after")
    hvd.stop_timeline()
    if rank == 0:
        time.sleep(0.3)
        assert os.path.getsize(path("limited")) == size_then, "the timeline went on writing"
    hvd.start_timeline(path("again"))  # a new timeline works
    workload(rank, size, "again")
    hvd.shutdown()
    if rank == 0:
        check_events(parse(path("again"), closed=True), "again", False, False)


main(body)
