"""Where a training step's time goes: the instruments of `training_scaling.py
--breakdown`, and the reading of a Perseus timeline per step.

In a rank (nothing here edits perseus/; each instrument wraps from the outside):
* HookTimer: wall time inside every post-accumulate-grad hook registered while
  it wraps (Perseus's DistributedOptimizer and drop-in DDP register theirs so).
* timed_method: wall time inside one method of one object (the optimizer's
  synchronize(), which step() calls).
* thread_counters: CPU time and context switches of each thread of this process,
  from /proc/self/task (the engine and lane threads name themselves).

In the driver: timeline_per_step() cuts rank 0's Chrome trace into steps.
"""
import bisect
import contextlib
import os
import statistics
import time
from collections import defaultdict

# ---- in a rank ----------------------------------------------------------------------


class HookTimer:
    """Time and calls inside the gradient hooks since the last reset()."""

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0

    def reset(self):
        self.seconds, self.calls = 0.0, 0

    @contextlib.contextmanager
    def wrapping(self):
        """Hooks registered inside this block are timed (torch's method is put back after)."""
        import torch
        original = torch.Tensor.register_post_accumulate_grad_hook
        timer = self

        def register(tensor, hook):
            def timed(param):
                start = time.perf_counter()
                try:
                    return hook(param)
                finally:
                    timer.seconds += time.perf_counter() - start
                    timer.calls += 1
            return original(tensor, timed)

        torch.Tensor.register_post_accumulate_grad_hook = register
        try:
            yield self
        finally:
            torch.Tensor.register_post_accumulate_grad_hook = original


class timed_method:
    """Replaces obj.name by a wrapper adding its wall time to .seconds (an instance
    attribute shadows the class's method, so the object's own calls go through it)."""

    def __init__(self, obj, name):
        self.seconds = 0.0
        inner = getattr(obj, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        setattr(obj, name, wrapper)


def _read(path):
    with open(path) as f:
        return f.read()


def thread_counters():
    """{tid: (name, cpu seconds, voluntary switches, involuntary switches)} of this
    process's threads (utime + stime of /proc/self/task/T/stat, in clock ticks)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        base = "/proc/self/task/%s/" % tid
        try:
            name = _read(base + "comm").strip()
            fields = _read(base + "stat").rsplit(")", 1)[1].split()
            status = dict(line.split(":", 1) for line in _read(base + "status").splitlines()
                          if ":" in line)
        except OSError:  # the thread ended meanwhile
            continue
        # Fields 14 and 15 of stat (utime, stime); the split starts at field 3.
        cpu = (int(fields[11]) + int(fields[12])) / tick
        out[int(tid)] = (name, cpu, int(status["voluntary_ctxt_switches"]),
                         int(status["nonvoluntary_ctxt_switches"]))
    return out


def thread_deltas(before, after, training_tid, steps):
    """{label: {"cpu_ms", "voluntary", "involuntary"} per step} for the training
    thread, each perseus-engine / perseus-lane thread (lanes numbered by thread id)
    and the sum of all other threads. Threads must exist at both ends."""
    lanes = 0
    rows = {}
    other = [0.0, 0, 0]
    for tid in sorted(set(before) & set(after)):
        name = after[tid][0]
        delta = [a - b for a, b in zip(after[tid][1:], before[tid][1:])]
        if tid == training_tid:
            label = "training thread"
        elif name == "perseus-engine":
            label = name
        elif name.startswith("perseus-lane"):
            label, lanes = "perseus-lane%d" % lanes, lanes + 1
        else:
            other = [o + d for o, d in zip(other, delta)]
            continue
        rows[label] = delta
    rows["other threads"] = other
    return {label: {"cpu_ms": cpu * 1e3 / steps, "voluntary": vol / steps,
                    "involuntary": invol / steps}
            for label, (cpu, vol, invol) in rows.items()}


# ---- in the driver: the timeline ---------------------------------------------------

TIMELINE_ROWS = (
    ("negotiate_total", "NEGOTIATE, summed over tensors (ms)"),
    ("negotiate_max", "NEGOTIATE, longest tensor (ms)"),
    ("queued_total", "QUEUED, summed over tensors (ms)"),
    ("queued_max", "QUEUED, longest tensor (ms)"),
    ("allreduce", "ALLREDUCE, summed over batches (ms)"),
    ("memcpy_in", "MEMCPY_IN_FUSION_BUFFER (ms)"),
    ("memcpy_out", "MEMCPY_OUT_FUSION_BUFFER (ms)"),
    ("window", "first negotiation to last ALLREDUCE end (ms)"),
    ("batches", "fused batches"),
    ("tensors", "tensors reduced (buckets, with DDP or gradient views)"),
)


def timeline_per_step(events, first_step, steps):
    """Medians over steps first_step .. first_step+steps-1 of TIMELINE_ROWS, from a
    Perseus timeline's events, or None when it holds no such step.

    Every tensor track that has ALLREDUCE spans is taken to be reduced once per step
    (true of gradients), so a track's k-th ALLREDUCE is step k's; a NEGOTIATE or
    QUEUED span belongs to the first ALLREDUCE of its track that ends after it
    starts, a MEMCPY to the ALLREDUCE around it. A fused batch puts the same
    ALLREDUCE (and MEMCPY) span on each of its tensors: each is counted once."""
    tracks = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("tid"):  # tid 0: the negotiation rounds
            tracks[(e.get("pid"), e["tid"])].append(e)
    per_step = defaultdict(lambda: {"negotiate": [], "queued": [], "batches": {},
                                    "memcpy_in": {}, "memcpy_out": {}, "start": [], "end": []})
    for (pid, _), spans in tracks.items():
        ends = sorted(e["ts"] + e["dur"] for e in spans if e["name"] == "ALLREDUCE")
        if not ends:
            continue
        for e in spans:
            k = bisect.bisect_right(ends, e["ts"]) - first_step
            if not 0 <= k < steps:
                continue
            row, name, dur = per_step[k], e["name"], e["dur"] / 1e3
            if name == "NEGOTIATE_ALLREDUCE":
                row["negotiate"].append(dur)
                row["start"].append(e["ts"])
            elif name == "QUEUED":
                row["queued"].append(dur)
            elif name == "ALLREDUCE":
                row["batches"][(pid, e.get("args", {}).get("lane"), e["ts"], e["dur"])] = dur
                row["end"].append(e["ts"] + e["dur"])
            elif name == "MEMCPY_IN_FUSION_BUFFER":
                row["memcpy_in"][(pid, e["ts"], e["dur"])] = dur
            elif name == "MEMCPY_OUT_FUSION_BUFFER":
                row["memcpy_out"][(pid, e["ts"], e["dur"])] = dur
    values = defaultdict(list)
    for row in per_step.values():
        if not row["end"]:  # negotiated, never reduced: the run stopped mid-step
            continue
        values["negotiate_total"].append(sum(row["negotiate"]))
        values["negotiate_max"].append(max(row["negotiate"], default=0.0))
        values["queued_total"].append(sum(row["queued"]))
        values["queued_max"].append(max(row["queued"], default=0.0))
        values["allreduce"].append(sum(row["batches"].values()))
        values["memcpy_in"].append(sum(row["memcpy_in"].values()))
        values["memcpy_out"].append(sum(row["memcpy_out"].values()))
        start = min(row["start"], default=min(row["end"]))
        values["window"].append((max(row["end"]) - start) / 1e3)
        values["batches"].append(len(row["batches"]))
        values["tensors"].append(len(row["end"]))
    return {key: statistics.median(v) for key, v in values.items()} if values else None
