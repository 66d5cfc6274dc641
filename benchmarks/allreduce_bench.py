#!/usr/bin/env python
"""Allreduce benchmark: Perseus against raw mpi4py (the floor) and torch gloo.

Run on two ranks of one machine:

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/allreduce_bench.py [--iters N] [--sizes 4K 1M ...]
        [--repeat R] [--json out.json] [--plot out.png] [--skip-perseus]
    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/allreduce_bench.py --autotune [--rounds 3] [--sweep axes]

--autotune measures only the ResNet-50 set: PERSEUS_AUTOTUNE's settled throughput
against a sweep of fixed settings (autotune_compare.py), instead of what follows.

Everything is measured in one run, by the same processes. One round is:

  1. floor: raw mpi4py in-place Allreduce (MPI.IN_PLACE, float32 numpy) of
     every size, and of the ResNet-50 gradient set as one fused call and as
     161 separate calls. perseus is not initialised (not even imported in
     the first round).
  2. idle cost, --idle-cycles times: raw mpi4py at every size before
     init(); hvd.init(); the same while perseus is idle; a little perseus
     work (allreduce_ at every size); the same again, perseus idle after
     work; hvd.shutdown(). Short alternating blocks, so that the
     before/after ratios (median over cycles) do not measure machine drift.
  3. perseus: hvd.init(); for every size, named in-place hvd.allreduce_
     interleaved iteration by iteration with a raw mpi4py Allreduce of the
     same size; unnamed hvd.allreduce at 4 KiB (also interleaved); the
     ResNet-50 set (161 allreduce_async_ then synchronize) interleaved with
     one fused raw Allreduce; hvd.shutdown().
  4. torch.distributed gloo all_reduce of every size and of the ResNet-50
     set (161 async all_reduce, then wait). Last, so that gloo's threads
     never run next to the other measurements.

--repeat R runs R rounds and reports the median of the per-round medians;
ratios are the median of the per-round (per-cycle for idle) ratios. perseus
is therefore init()ed and shut down several times in one run.

Each timed iteration: refill the buffer (untimed), barrier (MPI; gloo's own
for gloo, see --gloo-barrier), time the operation with perf_counter_ns. A
sample is the maximum over the ranks of that iteration's time (the
collective is done when it is done everywhere). Warm-up iterations are
discarded. Every iteration checks the first and last element of every
result, and the first and last iteration check every element, so a broken
implementation cannot produce a fast wrong number.

Why the interleaved column: on a shared machine the raw MPI time of the
same call drifts between runs and even within a run. The
pre-init floor is the number the issue asks for; the raw call interleaved
with perseus (perseus idle between its own calls) sees the same drift as
perseus, so perseus/interleaved is the ratio that noise cannot fake.
"""

import argparse
import json
import os
import platform
import socket
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

from resnet50_shapes import RESNET50_NUMEL, RESNET50_SHAPES

KiB = 1024
MiB = 1024 * KiB
DEFAULT_SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]
# The idle check covers every power of two in between (issue 16, item 11).
IDLE_SIZES = [4 * KiB << i for i in range(15)]  # 4 KiB .. 64 MiB

# Targets from issue 2 (2 ranks on the 2-core dev machine).
TARGET_SMALL_SECONDS = 30e-6      # perseus 4 KiB allreduce, absolute
TARGET_1M_RATIO = 1.3             # perseus / raw MPI at 1 MiB
TARGET_64M_RATIO = 1.05           # perseus / raw MPI at 64 MiB
TARGET_RESNET_RATIO = 1.15        # perseus set / one fused raw MPI call
TARGET_IDLE_RATIO = 1.1           # raw MPI while perseus idle / before init


# ---------------------------------------------------------------- helpers

# The ResNet-50 gradient set lives in resnet50_shapes.py (shared with gpu_bench.py).
RESNET50_BYTES = RESNET50_NUMEL * 4


def parse_size(text):
    """'4K', '4KiB', '1M', '64MiB', '4096' -> bytes (multiple of 4)."""
    t = text.strip().upper().replace("IB", "").replace("B", "")
    mult = 1
    if t and t[-1] in "KMG":
        mult = {"K": KiB, "M": MiB, "G": 1024 * MiB}[t[-1]]
        t = t[:-1]
    try:
        n = int(float(t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 4K, 1M, 4096)")
    if n <= 0 or n % 4:
        raise argparse.ArgumentTypeError(
            f"size {text!r} must be a positive multiple of 4 bytes")
    return n


def fmt_size(n):
    if n == RESNET50_BYTES:
        return "97.5 MiB"
    if n % MiB == 0:
        return f"{n // MiB} MiB"
    if n % KiB == 0:
        return f"{n // KiB} KiB"
    return f"{n} B"


def fmt_time(s):
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    return f"{s * 1e3:.2f} ms"


def fmt_x(r):
    return "—" if r is None else f"{r:.2f}×"


def stats(samples):
    a = np.asarray(samples, dtype=np.float64)
    return {
        "median": float(np.median(a)),
        "p10": float(np.percentile(a, 10)),
        "p90": float(np.percentile(a, 90)),
        "min": float(a.min()),
        "mean": float(a.mean()),
        "iters": int(a.size),
    }


class BenchError(RuntimeError):
    pass


class Case:
    """One timed operation: refill() and check(full) are untimed, op() is timed.

    check(full) returns None when the result is right, else a message; full
    asks for every element, otherwise the first and last are enough.
    """

    def __init__(self, key, desc, nbytes, refill, op, check, barrier=None):
        self.key, self.desc, self.nbytes = key, desc, nbytes
        self.refill, self.op, self.check = refill, op, check
        self.barrier = barrier


class Bench:
    """Runs cases on all ranks and keeps their per-round samples."""

    def __init__(self, comm, args):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.args = args
        self.expected = float(self.size * (self.size + 1) // 2)  # sum of rank+1
        self.fill_value = float(self.rank + 1)
        self.results = {}   # key -> [per round: {"stats", "samples"}]
        self.meta = {}      # key -> {"desc", "bytes", "barrier", "interleaved_with"}
        self.thread_watch = {}  # label -> (threads, ticks, switches): see watch_threads

    def iters_for(self, nbytes):
        """--iters up to 1 MiB; bigger sizes scale down, at least --min-iters."""
        n = self.args.iters
        if nbytes > MiB:
            n = max(self.args.min_iters, int(n * MiB / nbytes))
        return n

    def log(self, msg):
        if self.rank == 0 and not self.args.quiet:
            print(msg, flush=True)

    def run(self, *cases, iters=None):
        """Time the cases interleaved: one iteration of each in turn, the order
        reversed every other iteration (ABBA), so they share any drift."""
        comm = self.comm
        iters = iters or min(self.iters_for(c.nbytes) for c in cases)
        warmup = max(self.args.min_warmup, iters // 10)
        samples = [np.empty(iters, dtype=np.float64) for _ in cases]
        errors = [None] * len(cases)
        clock = time.perf_counter_ns
        total = warmup + iters
        for i in range(total):
            order = range(len(cases)) if i % 2 == 0 else range(len(cases) - 1, -1, -1)
            full = i == 0 or i == total - 1
            for j in order:
                c = cases[j]
                c.refill()
                (c.barrier or comm.Barrier)()
                t0 = clock()
                c.op()
                t1 = clock()
                if errors[j] is None:
                    errors[j] = c.check(full)
                if i >= warmup:
                    samples[j][i - warmup] = (t1 - t0) * 1e-9
        # Agree on correctness on every rank, then raise everywhere (no hang).
        bad = comm.allreduce(1 if any(errors) else 0, op=MPI.MAX)
        if bad:
            every = comm.allgather(errors)
            detail = "; ".join(f"{cases[j].key} on rank {r}: {e}"
                               for r, errs in enumerate(every)
                               for j, e in enumerate(errs) if e)
            raise BenchError(f"wrong result: {detail}")
        out = []
        for j, c in enumerate(cases):
            comm.Allreduce(MPI.IN_PLACE, samples[j], op=MPI.MAX)
            st = stats(samples[j])
            self.results.setdefault(c.key, []).append(
                {"stats": st, "samples": samples[j].tolist()})
            self.meta[c.key] = {
                "desc": c.desc, "bytes": c.nbytes,
                "barrier": "MPI" if c.barrier is None else "gloo",
                "interleaved_with": [o.key for o in cases if o is not c]}
            self.log(f"  {c.key:<36} median {fmt_time(st['median']):>10}  "
                     f"p10 {fmt_time(st['p10']):>10}  p90 {fmt_time(st['p90']):>10}"
                     f"  ({iters} iters)")
            out.append(st)
        return out

    # -- results ----------------------------------------------------------

    def median_of(self, key):
        rounds = self.results.get(key)
        if not rounds:
            return None
        return float(np.median([r["stats"]["median"] for r in rounds]))

    def ratio(self, num, den):
        """Median over rounds of (median num / median den) in the same round."""
        a, b = self.results.get(num), self.results.get(den)
        if not a or not b or len(a) != len(b):
            return None
        return float(np.median([x["stats"]["median"] / y["stats"]["median"]
                                for x, y in zip(a, b)]))

    def summary(self, key):
        rounds = self.results[key]
        per = [r["stats"] for r in rounds]
        return dict(self.meta[key],
                    median=float(np.median([s["median"] for s in per])),
                    p10=float(np.median([s["p10"] for s in per])),
                    p90=float(np.median([s["p90"] for s in per])),
                    round_medians=[s["median"] for s in per],
                    rounds=rounds)

    # -- correctness --------------------------------------------------------

    def np_check(self, arrays):
        want = self.expected

        def check(full):
            for a in arrays:
                f = a.reshape(-1)
                if f.size == 0:
                    continue
                if full:
                    bad = np.flatnonzero(f != want)
                    if bad.size:
                        j = int(bad[0])
                        return (f"{bad.size} of {f.size} elements wrong, e.g. "
                                f"[{j}] = {f[j]!r}, expected {want}")
                elif f[0] != want or f[-1] != want:
                    return f"ends are {f[0]!r}, {f[-1]!r}, expected {want}"
            return None
        return check

    def torch_check(self, tensors_fn):
        """tensors_fn() -> the torch tensors holding the results."""
        def check(full):
            return self.np_check([t.numpy() for t in tensors_fn()])(full)
        return check


# ---------------------------------------------------------------- cases

def mpi_case(b, key, desc, nbytes):
    comm = b.comm
    buf = np.empty(nbytes // 4, dtype=np.float32)
    spec = [buf, MPI.FLOAT]
    return Case(key, desc, nbytes,
                refill=lambda: buf.fill(b.fill_value),
                op=lambda: comm.Allreduce(MPI.IN_PLACE, spec, op=MPI.SUM),
                check=b.np_check([buf]))


def mpi_resnet_161_case(b, key):
    comm = b.comm
    grads = [np.empty(s, dtype=np.float32) for s in RESNET50_SHAPES]
    specs = [[g, MPI.FLOAT] for g in grads]

    def refill():
        for g in grads:
            g.fill(b.fill_value)

    def op():
        for s in specs:
            comm.Allreduce(MPI.IN_PLACE, s, op=MPI.SUM)

    return Case(key, "161 raw Allreduce calls, one per ResNet-50 tensor",
                RESNET50_BYTES, refill, op, b.np_check(grads))


def torch_grads():
    import torch
    return [torch.empty(s, dtype=torch.float32) for s in RESNET50_SHAPES]


def fill_all(tensors, value):
    for t in tensors:
        t.fill_(value)


# ---------------------------------------------------------------- phases

def phase_floor(b, sizes, do_resnet):
    b.log("floor: raw mpi4py Allreduce (MPI.IN_PLACE, float32), perseus not initialised:")
    for n in sizes:
        b.run(mpi_case(b, f"mpi4py.floor.{n}", "raw mpi4py in-place Allreduce, "
                       "before perseus init", n))
    if do_resnet:
        b.run(mpi_case(b, "mpi4py.floor.resnet50.fused",
                       "one raw Allreduce of 25,557,032 float32, before perseus init",
                       RESNET50_BYTES))
        b.run(mpi_resnet_161_case(b, "mpi4py.floor.resnet50.161calls"))


def idle_iters_for(b, nbytes):
    """--idle-iters per round up to 1 MiB, scaled down above like --iters (at least
    --min-iters), spread over the cycles."""
    n = b.args.idle_iters
    if nbytes > MiB:
        n = max(b.args.min_iters, int(n * MiB / nbytes))
    return max(1, n // b.args.idle_cycles)


def idle_block(b, label, desc, sizes):
    for n in sizes:
        b.run(mpi_case(b, f"mpi4py.idle.{label}.{n}", desc, n), iters=idle_iters_for(b, n))


def import_hvd(comm):
    """perseus.torch.horovod, or a BenchError on every rank."""
    def load():
        import perseus.torch.horovod as hvd
        return hvd

    err = None
    try:
        hvd = load()
    except ImportError:
        # Not installed: fall back to this checkout (perseus/ beside benchmarks/),
        # whose core library `pip install -e .` builds in place.
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for m in [m for m in sys.modules if m == "perseus" or m.startswith("perseus.")]:
            del sys.modules[m]
        sys.path.insert(0, root)
        try:
            hvd = load()
        except (ImportError, OSError) as e:
            hvd, err = None, f"{type(e).__name__}: {e}"
    except OSError as e:
        hvd, err = None, f"{type(e).__name__}: {e}"
    errs = [e for e in comm.allgather(err) if e]
    if errs:
        raise BenchError(f"cannot import perseus.torch.horovod ({errs[0]}); "
                         f"install it (pip install -e .) or pass --skip-perseus")
    return hvd


def thread_counters():
    """{tid: (CPU ticks, context switches)} of this process's threads, from /proc:
    what an idle thread that polls or wakes would show whatever the machine's load
    (timings on a busy machine cannot show it). {} where /proc has no task stats."""
    counters = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return counters
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/status") as f:
                switches = sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
        counters[int(tid)] = (int(fields[11]) + int(fields[12]), switches)  # utime + stime
    return counters


def watch_threads(b, tids, label, seconds=None, during=None):
    """CPU ticks and context switches of threads `tids` (Perseus's, which appeared
    at init) over `seconds` of idleness or over the call `during`; the max over
    ranks lands in b.thread_watch[label]."""
    before = thread_counters()
    if during is not None:
        during()
    else:
        time.sleep(seconds)  # this thread sleeps: only the others could run
    after = thread_counters()
    ticks = switches = 0
    for tid in tids:
        if tid in before and tid in after:
            ticks += after[tid][0] - before[tid][0]
            switches += after[tid][1] - before[tid][1]
    mine = (len(tids), ticks, switches)
    b.thread_watch[label] = tuple(max(x) for x in zip(*b.comm.allgather(mine)))


def phase_idle_cost(b, sizes):
    """Raw MPI before init / after init / after work, in alternating cycles; in the
    first cycle, what Perseus's own threads do meanwhile (thread_counters)."""
    import torch
    hvd = import_hvd(b.comm)

    comm = b.comm
    b.log(f"idle cost: raw mpi4py Allreduce before hvd.init() and while perseus "
          f"is idle ({b.args.idle_cycles} cycles):")
    for cycle in range(b.args.idle_cycles):
        idle_block(b, "before", "raw mpi4py Allreduce before hvd.init()", sizes)
        existing = set(thread_counters())
        hvd.init()
        perseus_threads = set(thread_counters()) - existing
        try:
            idle_block(b, "after_init",
                       "raw mpi4py Allreduce after hvd.init(), perseus idle", sizes)
            for n in sizes:  # some work, so the engine has run (and allocated)
                t = torch.empty(n // 4, dtype=torch.float32)
                for _ in range(10 if n <= MiB else 3):
                    t.fill_(b.fill_value)
                    hvd.allreduce_(t, name=f"idle.work.{n}", op=hvd.Sum)
                err = b.np_check([t.numpy()])(True)
                if comm.allreduce(1 if err else 0, op=MPI.MAX):
                    raise BenchError(f"wrong result in idle-cost work: {err}")
            settle(b.args.settle)

            def block():
                idle_block(b, "after_work",
                           "raw mpi4py Allreduce after perseus work, perseus idle", sizes)

            if cycle == 0 and b.args.idle_watch > 0:
                watch_threads(b, perseus_threads, "idle", seconds=b.args.idle_watch)
                watch_threads(b, perseus_threads, "raw_mpi", during=block)
            else:
                block()
        finally:
            comm.Barrier()
            hvd.shutdown()


def settle(seconds):
    # Busy-wait rather than sleep: a sleeping vCPU may be descheduled or
    # migrated by the host, which shifts every later measurement.
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def phase_perseus(b, sizes, do_resnet):
    import torch
    hvd = import_hvd(b.comm)

    comm = b.comm
    b.log("perseus (perseus.torch.horovod), interleaved with raw mpi4py:")
    hvd.init()
    try:
        ok = hvd.size() == b.size and hvd.rank() == b.rank
        if not comm.allreduce(ok, op=MPI.LAND):
            raise BenchError(f"perseus sees rank {hvd.rank()} of {hvd.size()}, "
                             f"MPI says {b.rank} of {b.size} (or another rank "
                             f"disagrees)")
        for n in sizes:
            t = torch.empty(n // 4, dtype=torch.float32)
            name = f"bench.{n}"
            p = Case(f"perseus.allreduce_.{n}",
                     "hvd.allreduce_(t, name='bench.<size>', op=hvd.Sum)", n,
                     refill=lambda: t.fill_(b.fill_value),
                     op=lambda: hvd.allreduce_(t, name=name, op=hvd.Sum),
                     check=b.torch_check(lambda: [t]))
            m = mpi_case(b, f"mpi4py.interleaved.{n}",
                         "raw mpi4py in-place Allreduce, interleaved with perseus", n)
            b.run(p, m)
            del t, p, m

        # Unnamed and out of place, at 4 KiB: name generation + output allocation.
        n = 4 * KiB
        t = torch.empty(n // 4, dtype=torch.float32)
        out = [t]

        def op_unnamed():
            out[0] = hvd.allreduce(t, op=hvd.Sum)

        def check_unnamed(full):
            if out[0] is t or t[0].item() != b.fill_value:
                return "hvd.allreduce changed its input or returned it"
            return b.np_check([out[0].numpy()])(full)

        b.run(Case(f"perseus.allreduce.{n}", "hvd.allreduce(t, op=hvd.Sum), unnamed",
                   n, refill=lambda: t.fill_(b.fill_value), op=op_unnamed,
                   check=check_unnamed),
              mpi_case(b, f"mpi4py.interleaved.unnamed.{n}", "raw mpi4py in-place "
                       "Allreduce, interleaved with unnamed perseus", n))
        del t, out

        if do_resnet:
            grads = torch_grads()
            names = [f"grad.{i}" for i in range(len(grads))]

            def op():
                handles = [hvd.allreduce_async_(g, name=nm, op=hvd.Sum)
                           for g, nm in zip(grads, names)]
                for h in handles:
                    hvd.synchronize(h)

            p = Case("perseus.resnet50.async",
                     "161 hvd.allreduce_async_(g, name='grad.<i>', op=hvd.Sum), "
                     "then hvd.synchronize each", RESNET50_BYTES,
                     refill=lambda: fill_all(grads, b.fill_value), op=op,
                     check=b.torch_check(lambda: grads))
            m = mpi_case(b, "mpi4py.interleaved.resnet50.fused",
                         "one raw Allreduce of 25,557,032 float32, interleaved "
                         "with perseus", RESNET50_BYTES)
            b.run(p, m)
            del grads, p, m
    finally:
        comm.Barrier()
        hvd.shutdown()


def free_port(comm):
    port = None
    if comm.Get_rank() == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    return comm.bcast(port, root=0)


def phase_gloo(b, sizes, do_resnet):
    import torch
    import torch.distributed as dist

    comm = b.comm
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port(comm))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="env://",
                            rank=b.rank, world_size=b.size)
    # The barrier before each timed gloo iteration. On an oversubscribed machine
    # gloo after an MPI barrier can be bimodal (a scheduler slice or not:
    # benchmarks/README.md); after its own barrier it is mostly steady, so that is
    # the default.
    barrier = dist.barrier if b.args.gloo_barrier == "gloo" else None
    try:
        b.log("torch.distributed gloo all_reduce (float32, SUM):")
        for n in sizes:
            t = torch.empty(n // 4, dtype=torch.float32)
            b.run(Case(f"gloo.allreduce.{n}", "torch.distributed.all_reduce (gloo)", n,
                       refill=lambda: t.fill_(b.fill_value),
                       op=lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM),
                       check=b.torch_check(lambda: [t]), barrier=barrier))
            del t
        if do_resnet:
            grads = torch_grads()

            def op():
                works = [dist.all_reduce(g, op=dist.ReduceOp.SUM, async_op=True)
                         for g in grads]
                for w in works:
                    w.wait()

            b.run(Case("gloo.resnet50.async",
                       "161 gloo all_reduce(async_op=True), then wait each",
                       RESNET50_BYTES, refill=lambda: fill_all(grads, b.fill_value),
                       op=op, check=b.torch_check(lambda: grads), barrier=barrier))
            del grads
    finally:
        comm.Barrier()
        dist.destroy_process_group()


# ---------------------------------------------------------------- report

def build_report(b, sizes, args):
    med, ratio = b.median_of, b.ratio
    rows = []

    def row(case, nbytes, pkey, mkey, gkey, ikey):
        rows.append({
            "case": case, "size": nbytes,
            "perseus": med(pkey), "mpi4py": med(mkey), "gloo": med(gkey),
            "mpi4py_interleaved": med(ikey),
            "perseus_over_mpi4py": ratio(pkey, mkey),
            "perseus_over_gloo": ratio(pkey, gkey),
            "perseus_over_interleaved": ratio(pkey, ikey),
            "keys": {"perseus": pkey, "mpi4py": mkey, "gloo": gkey,
                     "mpi4py_interleaved": ikey}})

    for n in sizes:
        row("allreduce_ (named, in place)", n, f"perseus.allreduce_.{n}",
            f"mpi4py.floor.{n}", f"gloo.allreduce.{n}", f"mpi4py.interleaved.{n}")
    row("allreduce (unnamed)", 4 * KiB, "perseus.allreduce.4096",
        "mpi4py.floor.4096", "gloo.allreduce.4096", "mpi4py.interleaved.unnamed.4096")
    if not args.skip_resnet:
        row("ResNet-50 set: 161 async vs 1 fused raw call", RESNET50_BYTES,
            "perseus.resnet50.async", "mpi4py.floor.resnet50.fused",
            "gloo.resnet50.async", "mpi4py.interleaved.resnet50.fused")
        row("ResNet-50 set: 161 async vs 161 raw calls (info)", RESNET50_BYTES,
            "perseus.resnet50.async", "mpi4py.floor.resnet50.161calls",
            "gloo.resnet50.async", None)

    idle = []
    for n in args.idle_sizes:
        k = f"mpi4py.idle.%s.{n}"
        idle.append({"size": n,
                     "before_init": med(k % "before"),
                     "after_init": med(k % "after_init"),
                     "after_work": med(k % "after_work"),
                     "ratio_after_init": ratio(k % "after_init", k % "before"),
                     "ratio_after_work": ratio(k % "after_work", k % "before")})

    targets = []

    def verdict(value, goal):
        return "n/a" if value is None else ("PASS" if value <= goal else "MISS")

    def target(name, goal, floor, interleaved=None, text=None):
        targets.append({
            "target": name, "goal": goal,
            "value": floor, "status": verdict(floor, goal),
            "text": text or (fmt_x(floor) if floor is not None else "—"),
            "value_interleaved": interleaved,
            "status_interleaved": (verdict(interleaved, goal)
                                   if interleaved is not None else "n/a"),
        })

    p4 = med("perseus.allreduce_.4096")
    target("perseus 4 KiB allreduce_ ≤ 30 µs", TARGET_SMALL_SECONDS, p4,
           text=fmt_time(p4))
    for name, pkey, mkey, ikey, goal in (
            ("1 MiB ≤ 1.3× raw MPI", f"perseus.allreduce_.{MiB}",
             f"mpi4py.floor.{MiB}", f"mpi4py.interleaved.{MiB}", TARGET_1M_RATIO),
            ("64 MiB ≤ 1.05× raw MPI", f"perseus.allreduce_.{64 * MiB}",
             f"mpi4py.floor.{64 * MiB}", f"mpi4py.interleaved.{64 * MiB}",
             TARGET_64M_RATIO),
            ("ResNet-50 set ≤ 1.15× one fused raw call", "perseus.resnet50.async",
             "mpi4py.floor.resnet50.fused", "mpi4py.interleaved.resnet50.fused",
             TARGET_RESNET_RATIO)):
        target(name, goal, ratio(pkey, mkey), ratio(pkey, ikey))
    for r in idle:
        ratios = [x for x in (r["ratio_after_init"], r["ratio_after_work"])
                  if x is not None]
        text = ", ".join(f"{lbl} {fmt_x(x)}" for lbl, x in
                         (("after init", r["ratio_after_init"]),
                          ("after work", r["ratio_after_work"])) if x is not None)
        target(f"raw MPI {fmt_size(r['size'])} while perseus idle ≤ 1.1× before init",
               TARGET_IDLE_RATIO, max(ratios) if ratios else None, text=text or "—")
    return rows, idle, targets


def render_markdown(b, rows, idle, targets, args):
    out = []
    r = args.repeat
    out.append(f"Allreduce, {b.size} ranks, float32, SUM. Times: median over "
               f"{r} round(s) of each round's median; a sample is the max over "
               f"ranks of one iteration. Ratios: median of per-round ratios. "
               f"mpi4py = raw Allreduce before perseus init (the floor); "
               f"interleaved = raw Allreduce alternated with the perseus call.")
    out.append("")
    out.append("| case | size | perseus median | mpi4py median | gloo median "
               "| perseus/mpi4py | perseus/gloo | mpi4py interleaved "
               "| perseus/interleaved |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for x in rows:
        out.append(f"| {x['case']} | {fmt_size(x['size'])} | {fmt_time(x['perseus'])} "
                   f"| {fmt_time(x['mpi4py'])} | {fmt_time(x['gloo'])} "
                   f"| {fmt_x(x['perseus_over_mpi4py'])} "
                   f"| {fmt_x(x['perseus_over_gloo'])} "
                   f"| {fmt_time(x['mpi4py_interleaved'])} "
                   f"| {fmt_x(x['perseus_over_interleaved'])} |")
    out.append("")
    if any(x["after_init"] or x["after_work"] for x in idle):
        out.append(f"Raw mpi4py Allreduce while perseus is initialised but idle "
                   f"({args.idle_cycles} alternating cycles per round; ratios are "
                   f"the median of per-cycle ratios):")
        out.append("")
        out.append("| size | before init | after init (idle) | after work (idle) "
                   "| after init / before | after work / before |")
        out.append("|---:|---:|---:|---:|---:|---:|")
        for x in idle:
            out.append(f"| {fmt_size(x['size'])} | {fmt_time(x['before_init'])} "
                       f"| {fmt_time(x['after_init'])} | {fmt_time(x['after_work'])} "
                       f"| {fmt_x(x['ratio_after_init'])} "
                       f"| {fmt_x(x['ratio_after_work'])} |")
        out.append("")
    for label, what in (("idle", f"over {args.idle_watch:g} s of idleness after work"),
                        ("raw_mpi", "during the after-work raw MPI block (cycle 1)")):
        if label in b.thread_watch:
            n, ticks, switches = b.thread_watch[label]
            out.append(f"Perseus's {n} threads {what}: {ticks} CPU ticks "
                       f"(1 tick = {1000 // os.sysconf('SC_CLK_TCK')} ms), {switches} "
                       f"context switches (max over ranks).")
    if b.thread_watch:
        out.append("")
    out.append("Targets (issue 2). Ratios against the pre-init floor, and against "
               "the raw call interleaved with perseus:")
    out.append("")
    out.append("| target | measured | result | vs interleaved | result |")
    out.append("|---|---|---|---|---|")
    for t in targets:
        inter = t["value_interleaved"]
        out.append(f"| {t['target']} | {t['text']} | {t['status']} "
                   f"| {fmt_x(inter) if inter is not None else '—'} "
                   f"| {t['status_interleaved'] if inter is not None else '—'} |")
    out.append("")
    out.append("Every measurement (p10 / p90: median over rounds of each round's):")
    out.append("")
    out.append("| measurement | size | p10 | median | p90 | iters | round medians |")
    out.append("|---|---:|---:|---:|---:|---:|---|")
    for key in b.results:
        s = b.summary(key)
        it = b.results[key][0]["stats"]["iters"]
        rm = " ".join(fmt_time(v) for v in s["round_medians"])
        out.append(f"| {key} | {fmt_size(s['bytes'])} | {fmt_time(s['p10'])} "
                   f"| {fmt_time(s['median'])} | {fmt_time(s['p90'])} | {it} | {rm} |")
    return "\n".join(out)


def environment(comm):
    import torch
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("PERSEUS_", "HOROVOD_", "MPIR_CVAR_", "OMP_", "GLOO_"))}
    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    return {
        "world_size": comm.Get_size(),
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "mpi4py": __import__("mpi4py").__version__,
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "mpi_thread_level": levels.get(MPI.Query_thread()),
        "perseus": getattr(sys.modules.get("perseus"), "__file__", None),
        "env": env,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_at_end": loadavg(),
    }


class CpuMeter:
    """CPU time that other processes (and the hypervisor: steal) took from this
    machine while the benchmark ran: the part of the noise we can see."""

    def __init__(self, comm):
        self.comm = comm
        self.t0 = time.perf_counter()
        self.own0 = self._own()
        self.sys0 = self._system()

    @staticmethod
    def _own():
        try:
            with open("/proc/self/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    @staticmethod
    def _system():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
            hz = os.sysconf("SC_CLK_TCK")
            busy = v[0] + v[1] + v[2] + v[5] + v[6]  # user nice system irq softirq
            steal = v[7] if len(v) > 7 else 0
            return busy / hz, steal / hz
        except (OSError, ValueError, IndexError):
            return None

    def report(self):
        """Collective. Returns a dict on rank 0 (None elsewhere or if unknown)."""
        own1, sys1 = self._own(), self._system()
        wall = time.perf_counter() - self.t0
        own = None if own1 is None or self.own0 is None else own1 - self.own0
        owns = self.comm.gather(own, root=0)
        if self.comm.Get_rank() != 0 or None in owns or not sys1 or not self.sys0:
            return None
        cpus = os.cpu_count() or 1
        other = max(0.0, (sys1[0] - self.sys0[0]) - sum(owns))
        steal = sys1[1] - self.sys0[1]
        return {"wall_s": wall, "cpus": cpus, "own_cpu_s": sum(owns),
                "other_cpu_s": other, "steal_s": steal,
                "other_fraction": other / (cpus * wall) if wall > 0 else None,
                "steal_fraction": steal / (cpus * wall) if wall > 0 else None}


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[:3]
    except OSError:
        return None


def plot(path, b, sizes, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot: matplotlib is not installed; not writing {path} "
              f"(pip install matplotlib)", flush=True)
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for label, prefix, style in (
            ("perseus allreduce_", "perseus.allreduce_", "o-"),
            ("mpi4py (floor, before init)", "mpi4py.floor", "s--"),
            ("mpi4py (interleaved)", "mpi4py.interleaved", "x:"),
            ("gloo", "gloo.allreduce", "^-.")):
        pts = [(n, b.median_of(f"{prefix}.{n}")) for n in sizes]
        pts = [(x, y) for x, y in pts if y]
        if pts:
            ax1.loglog([x for x, _ in pts], [y * 1e6 for _, y in pts], style,
                       label=label)
    ax1.set_xlabel("message size (bytes)")
    ax1.set_ylabel("median time (µs)")
    ax1.set_title(f"allreduce, float32, {b.size} ranks")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend()
    bars = [(lbl, b.median_of(k)) for lbl, k in (
        ("perseus\n161 async", "perseus.resnet50.async"),
        ("mpi4py\n1 fused", "mpi4py.floor.resnet50.fused"),
        ("mpi4py 1 fused\ninterleaved", "mpi4py.interleaved.resnet50.fused"),
        ("mpi4py\n161 calls", "mpi4py.floor.resnet50.161calls"),
        ("gloo\n161 async", "gloo.resnet50.async"))]
    bars = [(lbl, v) for lbl, v in bars if v]
    if bars:
        ax2.bar([lbl for lbl, _ in bars], [v * 1e3 for _, v in bars])
        ax2.set_ylabel("median time (ms)")
        ax2.set_title("ResNet-50 gradient set (161 tensors, 25.6 M float32)")
    else:
        ax2.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", flush=True)


# ---------------------------------------------------------------- autotune

def autotune_comparison(args):
    """--autotune: the ResNet-50 set (161 hvd.allreduce_async_, op=Average, then
    synchronize each) under every fixed setting of the sweep and under autotune."""
    import torch
    import autotune_compare
    comm = MPI.COMM_WORLD
    hvd = import_hvd(comm)
    expected = (comm.Get_size() + 1) / 2  # the mean of rank + 1, unchanged by averaging again

    def make_step():
        grads = torch_grads()
        fill_all(grads, float(comm.Get_rank() + 1))
        names = [f"grad.{i}" for i in range(len(grads))]

        def step():
            handles = [hvd.allreduce_async_(g, name=nm, op=hvd.Average)
                       for g, nm in zip(grads, names)]
            for h in handles:
                hvd.synchronize(h)
            ends = (grads[0].view(-1)[0].item(), grads[-1].view(-1)[-1].item())
            if ends != (expected, expected):
                raise BenchError(f"wrong result: ends {ends}, expected {expected}")
        return step

    autotune_compare.compare(hvd, make_step, RESNET50_BYTES / MiB, "MiB reduced/s", args)
    return 0


# ---------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Perseus allreduce benchmark against raw mpi4py and torch gloo "
                    "(run under mpirun -np 2).")
    p.add_argument("--iters", type=int, default=200,
                   help="timed iterations for sizes up to 1 MiB; bigger sizes use "
                        "iters*1MiB/size, at least --min-iters (default 200)")
    p.add_argument("--min-iters", type=int, default=20,
                   help="least timed iterations, for big sizes and the ResNet-50 "
                        "set (default 20)")
    p.add_argument("--min-warmup", type=int, default=3,
                   help="least warm-up iterations; otherwise iters/10 (default 3)")
    p.add_argument("--idle-iters", type=int, default=None,
                   help="iterations of each raw-MPI idle-cost case per round up to "
                        "1 MiB (bigger sizes scale down as for --iters), split over "
                        "the cycles (default 5*iters)")
    p.add_argument("--idle-cycles", type=int, default=4,
                   help="before-init / after-init / after-work cycles per round "
                        "for the idle cost (default 4)")
    p.add_argument("--sizes", nargs="+", type=parse_size, default=DEFAULT_SIZES,
                   help="message sizes, e.g. 4K 64K 1M 16M 64M (the default)")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of the whole comparison; the report takes the "
                        "median of per-round medians (default 1; 3 for numbers "
                        "you quote). perseus is init()ed and shut down each round")
    p.add_argument("--json", metavar="PATH", help="write every number to PATH")
    p.add_argument("--plot", metavar="PATH", help="write a PNG plot (needs matplotlib)")
    p.add_argument("--skip-perseus", action="store_true",
                   help="measure only the baselines (perseus need not be installed)")
    p.add_argument("--skip-gloo", action="store_true", help="do not measure torch gloo")
    p.add_argument("--skip-resnet", action="store_true",
                   help="do not measure the ResNet-50 gradient set")
    p.add_argument("--no-idle", dest="idle", action="store_false",
                   help="do not measure raw MPI while perseus is idle")
    p.add_argument("--idle-only", action="store_true",
                   help="only the floor and the idle cost (raw MPI while perseus is idle)")
    p.add_argument("--idle-sizes", nargs="+", type=parse_size, default=IDLE_SIZES,
                   help="sizes of the idle check (default: every power of two from "
                        "4K to 64M)")
    p.add_argument("--idle-watch", type=float, default=5.0,
                   help="seconds for which the idle check counts the CPU time and "
                        "wake-ups of Perseus's idle threads (default 5; 0: off)")
    p.add_argument("--settle", type=float, default=0.0,
                   help="seconds to busy-wait after perseus work before the "
                        "after-work idle block (default 0; its warm-up covers "
                        "the tail)")
    p.add_argument("--gloo-barrier", choices=("gloo", "mpi"), default="gloo",
                   help="barrier before each timed gloo iteration: torch "
                        "dist.barrier() (default) or the MPI barrier")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch.set_num_threads (default 1: the ranks share the cores)")
    p.add_argument("--quiet", action="store_true", help="print only the final report")
    p.add_argument("--autotune", action="store_true",
                   help="only the ResNet-50 set: autotune against a sweep of fixed settings")
    import autotune_compare
    autotune_compare.add_arguments(p)
    args = p.parse_args(argv)
    if args.idle_iters is None:
        args.idle_iters = 5 * args.iters
    if min(args.iters, args.min_iters, args.idle_iters, args.idle_cycles,
           args.repeat) < 1:
        p.error("--iters, --min-iters, --idle-iters, --idle-cycles and --repeat "
                "must be ≥ 1")
    args.sizes = sorted(set(args.sizes))
    args.idle_sizes = sorted(set(args.idle_sizes))
    return args


def main(argv=None):
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    import torch
    torch.set_num_threads(args.torch_threads)

    if args.autotune:
        return autotune_comparison(args)
    b = Bench(comm, args)
    if b.size < 2 and b.rank == 0:
        print("note: 1 rank; launch with `mpirun -np 2` for the real comparison",
              flush=True)
    do_resnet = not args.skip_resnet
    load0 = loadavg()
    if load0:
        b.log(f"load average at start: {' '.join(load0)} on {os.cpu_count()} CPUs "
              f"(other work on the machine shows up as noise)")
    meter = CpuMeter(comm)
    t_start = time.perf_counter()
    for rnd in range(args.repeat):
        if args.repeat > 1:
            b.log(f"== round {rnd + 1} of {args.repeat}")
        phase_floor(b, args.sizes, do_resnet)
        if not args.skip_perseus:
            if args.idle:
                phase_idle_cost(b, args.idle_sizes)
            if not args.idle_only:
                phase_perseus(b, args.sizes, do_resnet)
        if not args.skip_gloo and not args.idle_only:
            phase_gloo(b, args.sizes, do_resnet)
    elapsed = time.perf_counter() - t_start
    cpu = meter.report()

    if b.rank != 0:
        return 0
    rows, idle, targets = build_report(b, args.sizes, args)
    print()
    print(render_markdown(b, rows, idle, targets, args))
    print(f"\n(benchmark time {elapsed:.1f} s)", flush=True)
    if cpu:
        print(f"Other processes used {100 * cpu['other_fraction']:.0f}% of the "
              f"{cpu['cpus']} CPUs during the run (hypervisor steal "
              f"{100 * cpu['steal_fraction']:.0f}%).", flush=True)
        if cpu["other_fraction"] > 0.05 or cpu["steal_fraction"] > 0.05:
            print("WARNING: the machine was not quiet; these numbers are noisy. "
                  "Rerun on an idle machine (and with --repeat 3) before "
                  "quoting them.", flush=True)
    if args.json:
        doc = {
            "environment": environment(comm),
            "args": vars(args),
            "elapsed_s": elapsed,
            "loadavg_at_start": load0,
            "cpu_contention": cpu,
            "resnet50": {"tensors": len(RESNET50_SHAPES), "numel": RESNET50_NUMEL,
                         "shapes": [list(s) for s in RESNET50_SHAPES]},
            "rows": rows,
            "idle": idle,
            "idle_threads": {k: dict(zip(("threads", "ticks", "switches"), v))
                             for k, v in b.thread_watch.items()},
            "targets": targets,
            "measurements": {k: b.summary(k) for k in b.results},
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}", flush=True)
    if args.plot:
        plot(args.plot, b, args.sizes, rows)
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    except SystemExit:
        raise
    except BenchError as e:
        # Raised on every rank together (the ranks agree before raising).
        if MPI.COMM_WORLD.Get_rank() == 0:
            sys.stderr.write(f"benchmark failed: {e}\n")
            sys.stderr.flush()
        rc = 1
    except BaseException:
        # Abort the whole job so that no other rank hangs in a collective.
        sys.stderr.write(f"[rank {MPI.COMM_WORLD.Get_rank()}] benchmark failed:\n")
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    sys.exit(rc)
