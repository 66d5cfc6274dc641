#!/usr/bin/env python
"""GPU benchmark (issue 14): Perseus on CUDA tensors at size 1 against NCCL through
torch.distributed at world size 1, every baseline measured in the same run.

    python benchmarks/gpu_bench.py [--iters N] [--steps N] [--json PATH]

No mpirun: one process, Perseus on MPI's singleton world of one, which still runs
the whole NCCL path (no size-1 shortcut in the core). Without a CUDA device it says
so and exits 0. A Markdown table of medians, ratios and the issue's goals goes to
stdout. Exit code 0 whatever the goals say; 1 if a result was wrong or a case failed.

What each row measures (samples interleaved A/B iteration by iteration, medians):
  * allreduce 4 KiB / 64 MiB: one in-place float32 Sum, wall time from the call to
    torch.cuda.synchronize() after it: Perseus hvd.allreduce_ against
    dist.all_reduce (NCCL). Goals <= 1.5x and <= 1.05x.
  * ResNet-50 set, 1/2/4 lanes: the 161 gradients (25.6 M float32) as
    allreduce_async_ + synchronize, against one dist.all_reduce of the same bytes
    in one flat buffer (161 calls from Python: for information). Goal <= 1.2x for
    the set as DistributedOptimizer reduces it: 161 parameters whose .grad is set,
    reduced by its synchronize() (at np=1 no hook runs, so synchronize does all of
    it), with gradient views (buckets reduced in place, nothing packed) and without
    (one request per gradient, gathered into one enqueue and packed). And once in one
    grouped_allreduce_ (one enqueue, packed into fusion buffers).
  * fusion pack + unpack: not visible from Python directly, so derived from device
    time (CUDA events) with the host kept ahead: a ~50 ms busy kernel is queued
    first, the events bracket everything queued behind it, and the host finishes
    enqueuing long before the GPU gets there (checked; else the row says so).
      A = the 161-tensor set in ONE fusion buffer (threshold raised), 1 lane, as one
          grouped_allreduce_ (per-tensor calls would make many small batches at np=1)
      D = one NCCL allreduce of the same bytes in one flat buffer (torch.distributed)
      C = one device-to-device copy of the same bytes (tensor.copy_)
    Packing and unpacking each copy every byte once, so pack + unpack = A - D and
    their bandwidth relative to a plain copy is 2C / (A - D). Goal >= 80 %. A - D
    also carries everything else Perseus adds on the device (event waits, the lane's
    scheduling): a conservative charge against fusion. For information the row's
    notes also give B, one flat tensor through Perseus (A - B would hide a pack of
    that lone tensor, were the engine to make one).
  * ResNet-50 training step, batch 64, synthetic data: forward, backward, SGD step,
    synchronize; DistributedOptimizer at size 1 against the plain optimizer on an
    identical model, steps interleaved. Goal overhead <= 1 % of the step. In the same
    run, torch's DistributedDataParallel at world size 1 against the same plain step,
    so the two overheads stand side by side.

CUDA graphs: what a captured step may contain is in docs/gpu.md.

--shared-np2 (issue 47, point 3): two ranks on GPU 0, under perseusrun -np 2 (or the
mpirun of its MPI), side by side with torch's DDP on the same NCCL, every baseline
measured in the same run:

    perseusrun -np 2 python benchmarks/gpu_bench.py --shared-np2 --nccl DIR/libnccl.so.2

  --nccl PATH (an NCCL 2.30 or later) runs each rank again with PATH in LD_PRELOAD,
  PERSEUS_NCCL_LIB=PATH and NCCL_MULTI_RANK_GPU_ENABLE=1, so that torch's NCCL calls and
  Perseus's reach that one library (torch's own 2.28.9 refuses two ranks on one GPU;
  benchmarks/README.md, its gpu_bench.py section, says why only LD_PRELOAD works).
  Before measuring it checks, and otherwise stops with exit code 2 and what to do: two
  ranks; the variable; the NCCL that torch's calls reach (ncclGetVersion in the process's
  global namespace, where the dynamic linker binds libtorch_cuda's NCCL symbols) is 2.30+
  and the same file Perseus loaded; Perseus runs shared-GPU ranks on NCCL; and a first
  all_reduce of torch's NCCL group gives the right sum. Rows (samples interleaved, each
  after a barrier, the slower rank's time; medians):
  * allreduce 4 KiB / --large-mib MiB in place (Sum): hvd.allreduce_ vs NCCL all_reduce;
  * the ResNet-50 set through DistributedOptimizer.synchronize() (gradient views, Sum)
    vs one flat NCCL all_reduce of the same bytes; goal <= 2x;
  * the ResNet-50 training step (batch --batch per rank, synthetic data) with
    DistributedOptimizer, Perseus's drop-in DDP, torch's DDP on NCCL, torch's DDP on
    "perseus" and plain torch (no communication), each a copy of one model, steps
    rotated among them.
  Checks: every reduction gives the exact sum (inputs +1 and -1 while timed, then once
  more 1 and 2 -> 3); after training, each reducing variant's parameters agree across
  the ranks (plain's must not: each rank has its own batch), and its change from the
  initial weights matches torch's DDP (within 5 %: a sum instead of an average is off by
  100 %). Ranks sharing a GPU time-slice it, so only the ratios within one run count
  (printed with the table). --device cpu (with --model resnet_small and small counts) is
  a smoke run of the same code on CPU tensors without a GPU
  (tests/gpu/test_gpu_tooling.py): gloo stands in for NCCL in the allreduce rows, and
  the torch DDP on NCCL row is skipped with its reason. --timeout: a rank that hangs
  dumps its stacks and exits 1.
"""

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from resnet50_shapes import RESNET50_NUMEL, RESNET50_SHAPES  # noqa: E402

KiB, MiB = 1024, 1024 * 1024
GOALS = {"4k": 1.5, "64m": 1.05, "resnet_set": 1.2, "pack_efficiency": 0.80, "train_overhead": 0.01}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=100, help="timed iterations per small case (default 100)")
    p.add_argument("--steps", type=int, default=20, help="timed training steps per side (default 20)")
    p.add_argument("--json", help="also write every sample here")
    p.add_argument("--shared-np2", action="store_true",
                   help="two ranks on GPU 0 against torch's DDP on NCCL (perseusrun -np 2; see above)")
    p.add_argument("--nccl", metavar="PATH",
                   help="a libnccl.so.2 (2.30 or later) for torch and Perseus alike (LD_PRELOAD)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="--shared-np2 only: cpu is a smoke run without a GPU (default cuda)")
    p.add_argument("--model", choices=("resnet50", "resnet_small"), default="resnet50",
                   help="--shared-np2 training rows' model (default resnet50)")
    p.add_argument("--batch", type=int, default=64, help="--shared-np2: batch per rank (default 64)")
    p.add_argument("--warmup", type=int, default=5, help="--shared-np2: untimed rounds first (default 5)")
    p.add_argument("--large-mib", type=int, default=64, help="--shared-np2: the large allreduce (default 64)")
    p.add_argument("--set-divisor", type=int, default=1,
                   help="--shared-np2: each ResNet-50 tensor's first dimension divided by this (the same "
                        "161 tensors, fewer bytes: for --device cpu; default 1)")
    p.add_argument("--timeout", type=float, default=420,
                   help="--shared-np2: seconds before a hung rank dumps its stacks and exits 1 (default 420)")
    return p.parse_args(argv)


# ---------------------------------------------------------------- timing

def wall(fn, torch):
    """Seconds from the call to the GPU being done with everything it queued."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def interleaved(a, b, iters, torch, warmup=5):
    """(samples of a, samples of b), ABBA-ordered so that drift hits both alike."""
    for _ in range(warmup):
        wall(a, torch)
        wall(b, torch)
    sa, sb = [], []
    for i in range(iters):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        t1, t2 = wall(first, torch), wall(second, torch)
        sa.append(t1 if first is a else t2)
        sb.append(t2 if first is a else t1)
    return sa, sb


class DeviceTimer:
    """Device time of what fn() queues, with the host kept ahead of the GPU by a busy
    kernel first (so the host's own overhead is not in the number)."""

    def __init__(self, torch, busy_ms=50.0):
        self.torch, self.busy_ms = torch, busy_ms
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        self.cycles_per_ms = 10_000_000 / max(start.elapsed_time(end), 1e-3)

    def __call__(self, fn):
        """(device seconds, whether the host finished enqueuing before the GPU got there)."""
        torch = self.torch
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        torch.cuda._sleep(int(self.busy_ms * self.cycles_per_ms))
        start.record()
        fn()
        end.record()
        host_ms = (time.perf_counter() - t0) * 1e3
        end.synchronize()
        return start.elapsed_time(end) / 1e3, host_ms < 0.8 * self.busy_ms


def training_step(model, opt, loss_fn, x, y):
    """One SGD step of `model` on the batch (x, y), as a callable to time."""
    def run():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return run


def median(xs):
    return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------- the run

class Bench:
    def __init__(self, args, torch, dist, hvd):
        self.args, self.torch, self.dist, self.hvd = args, torch, dist, hvd
        self.rows, self.samples, self.notes, self.errors = [], {}, [], []

    def restart(self, **env):
        """Perseus again with these PERSEUS_* settings (read at init)."""
        hvd = self.hvd
        if hvd.is_initialized():
            hvd.shutdown()
        for name in ("PERSEUS_ALLREDUCE_STREAMS", "PERSEUS_FUSION_THRESHOLD"):
            os.environ.pop(name, None)
        os.environ.update({k: str(v) for k, v in env.items()})
        hvd.init()

    def check(self, tensors, value, what):
        for t in tensors:
            if not bool((t == value).all()):
                self.errors.append("%s: wrong result (expected every element %r)" % (what, value))
                return

    def row(self, name, perseus, baseline, ratio, shown, goal, met, key):
        """shown: the ratio as the table prints it (1.03x, 85 %)."""
        self.rows.append((name, perseus, baseline, shown, goal, met))
        self.samples[key] = {"perseus": perseus, "baseline": baseline, "ratio": ratio}

    def allreduce_sizes(self):
        torch, dist, hvd = self.torch, self.dist, self.hvd
        self.restart()
        for nbytes, key, goal in ((4 * KiB, "4k", GOALS["4k"]), (64 * MiB, "64m", GOALS["64m"])):
            mine = torch.ones(nbytes // 4, device="cuda")
            theirs = torch.ones(nbytes // 4, device="cuda")
            name = "bench.ar.%d" % nbytes
            iters = self.args.iters if nbytes <= MiB else max(20, self.args.iters // 4)
            sa, sb = interleaved(lambda: hvd.allreduce_(mine, name=name, op=hvd.Sum),
                                 lambda: dist.all_reduce(theirs), iters, torch)
            self.check([mine, theirs], 1.0, name)
            ratio = median(sa) / median(sb)
            self.row("allreduce %s (in place, np=1) vs NCCL all_reduce" % ("4 KiB" if nbytes < MiB else "64 MiB"),
                     median(sa), median(sb), ratio, "%.3fx" % ratio, "<= %.2fx" % goal, ratio <= goal, key)
            self.samples[key].update(perseus_samples=sa, baseline_samples=sb)

    def resnet_set(self):
        torch, dist, hvd = self.torch, self.dist, self.hvd
        grads = [torch.ones(s, device="cuda") for s in RESNET50_SHAPES]
        flat = torch.ones(RESNET50_NUMEL, device="cuda")

        def perseus():
            handles = [hvd.allreduce_async_(g, name="bench.rn.%d" % i, op=hvd.Sum) for i, g in enumerate(grads)]
            for h in handles:
                hvd.synchronize(h)

        def grouped():
            hvd.grouped_allreduce_(grads, name="bench.rn.grouped", op=hvd.Sum)

        for lanes in (1, 2, 4):
            self.restart(PERSEUS_ALLREDUCE_STREAMS=lanes)
            used = hvd.lane_count()
            if used != lanes:
                self.notes.append("asked for %d lanes, the engine uses %d" % (lanes, used))
            sa, sb = interleaved(perseus, lambda: dist.all_reduce(flat), max(10, self.args.iters // 5), torch)
            self.check(grads + [flat], 1.0, "ResNet-50 set, %d lanes" % lanes)
            ratio = median(sa) / median(sb)
            goal = GOALS["resnet_set"]
            self.row("ResNet-50 set (%d tensors, %.1f MiB), %d lane%s vs 1 flat NCCL allreduce"
                     % (len(RESNET50_SHAPES), RESNET50_NUMEL * 4 / MiB, lanes, "" if lanes == 1 else "s"),
                     median(sa), median(sb), ratio, "%.3fx" % ratio,
                     "<= %.2fx" % goal, ratio <= goal, "resnet_set_lanes%d" % lanes)
        # The same set in one enqueue: the fused path without per-tensor calls (packed).
        sa, sb = interleaved(grouped, lambda: dist.all_reduce(flat), max(10, self.args.iters // 5), torch)
        self.check(grads + [flat], 1.0, "ResNet-50 set, grouped")
        ratio = median(sa) / median(sb)
        self.row("ResNet-50 set in one grouped_allreduce_ (packed, %d lanes) vs 1 flat NCCL allreduce"
                 % hvd.lane_count(), median(sa), median(sb), ratio, "%.3fx" % ratio,
                 "<= %.2fx" % GOALS["resnet_set"], ratio <= GOALS["resnet_set"], "resnet_set_grouped")

    def optimizer_set(self):
        """The ResNet-50 set through DistributedOptimizer.synchronize(), with and
        without gradient views, against one flat NCCL allreduce."""
        torch, dist, hvd = self.torch, self.dist, self.hvd
        from perseus.torch.optimizer import DistributedOptimizer
        self.restart()
        flat = torch.ones(RESNET50_NUMEL, device="cuda")
        goal = GOALS["resnet_set"]
        for views in (True, False):
            params = [torch.nn.Parameter(torch.zeros(s, device="cuda")) for s in RESNET50_SHAPES]
            opt = DistributedOptimizer(torch.optim.SGD(params, lr=0.0),
                                       named_parameters=[("p%d" % i, p) for i, p in enumerate(params)],
                                       op=hvd.Sum, gradient_as_bucket_view=views)
            for p in params:
                p.grad = torch.ones_like(p)

            def reduce():
                opt.synchronize()

            sa, sb = interleaved(reduce, lambda: dist.all_reduce(flat), max(10, self.args.iters // 5), torch)
            self.check([p.grad for p in params] + [flat], 1.0, "optimizer set, views %s" % views)
            ratio = median(sa) / median(sb)
            buckets = len(opt._buckets.buckets) if opt._buckets is not None else 0
            how = ("gradient views, %d buckets in place" % buckets if views
                   else "one request per gradient, packed")
            self.row("ResNet-50 set through DistributedOptimizer.synchronize() (%s) vs 1 flat NCCL "
                     "allreduce" % how, median(sa), median(sb), ratio, "%.3fx" % ratio,
                     "<= %.2fx" % goal, ratio <= goal, "optimizer_set_views%d" % views)
            if views:
                ptrs = [(b.flat.data_ptr(), b.flat.data_ptr() + b.flat.numel() * 4) for b in opt._buckets.buckets]
                viewed = sum(any(lo <= p.grad.data_ptr() < hi for lo, hi in ptrs) for p in params)
                self.notes.append("gradient views: %d of %d gradients are bucket views after the "
                                  "reductions, so 0 bytes were packed for them" % (viewed, len(params)))

    def pack_unpack(self):
        torch, dist, hvd = self.torch, self.dist, self.hvd
        nbytes = RESNET50_NUMEL * 4
        # Everything in one fusion buffer on one lane: A - D is one pack + one unpack (and overhead).
        self.restart(PERSEUS_ALLREDUCE_STREAMS=1, PERSEUS_FUSION_THRESHOLD=2 * nbytes)
        timer = DeviceTimer(torch)
        grads = [torch.ones(s, device="cuda") for s in RESNET50_SHAPES]
        flat = torch.ones(RESNET50_NUMEL, device="cuda")
        theirs = torch.ones(RESNET50_NUMEL, device="cuda")
        src, dst = torch.ones(RESNET50_NUMEL, device="cuda"), torch.empty(RESNET50_NUMEL, device="cuda")

        def fused():
            # One enqueue, so one batch: per-tensor calls at np=1 give the engine a
            # round every few tensors (the GPU hold is 1 MiB), and then A would time
            # dozens of small packs, not how fast the kernel packs a fusion buffer.
            hvd.grouped_allreduce_(grads, name="bench.pk", op=hvd.Sum)

        def single():
            hvd.allreduce_(flat, name="bench.pk.flat", op=hvd.Sum)

        cases = {"A": fused, "B": single, "C": lambda: dst.copy_(src), "D": lambda: dist.all_reduce(theirs)}
        times, ahead = {k: [] for k in cases}, True
        for _ in range(3):  # warm-up: negotiation cache, buffers allocated
            for fn in cases.values():
                timer(fn)
        for _ in range(max(5, self.args.iters // 10)):
            for key, fn in cases.items():
                seconds, kept_ahead = timer(fn)
                times[key].append(seconds)
                ahead = ahead and kept_ahead
        self.check(grads + [flat, theirs, dst], 1.0, "pack/unpack set")
        a, b, c, d = (median(times[k]) for k in "ABCD")
        pack = a - d
        efficiency = 2 * c / pack if pack > 0 else float("inf")
        goal = GOALS["pack_efficiency"]
        self.row("fusion pack + unpack (A - D) vs 2 device copies of the same bytes (2C)", pack, 2 * c,
                 efficiency, "%.0f %%" % (efficiency * 100), ">= %d %%" % (goal * 100), efficiency >= goal,
                 "pack_unpack")
        self.samples["pack_unpack"].update(host_kept_ahead=ahead, **times)
        self.notes.append("pack + unpack, device time: A %.3f ms (the set in one fusion buffer), D %.3f ms "
                          "(one flat NCCL allreduce), B %.3f ms (one flat tensor through Perseus), C %.3f ms "
                          "(a copy of %.1f MiB): pack + unpack move %.0f GB/s, a copy %.0f GB/s"
                          % (a * 1e3, d * 1e3, b * 1e3, c * 1e3, nbytes / MiB,
                             2 * nbytes / pack / 1e9 if pack > 0 else float("inf"), nbytes / c / 1e9))
        if not ahead:
            self.notes.append("pack + unpack: the host did not stay ahead of the GPU in every sample, so A "
                              "and B include host time: the efficiency is understated")

    def training_step(self):
        torch, hvd = self.torch, self.hvd
        from perseus.torch.optimizer import DistributedOptimizer
        self.restart()
        build, source = resnet50_constructor()
        torch.backends.cudnn.benchmark = True
        torch.manual_seed(0)
        plain_model = build().cuda()
        dist_model = build().cuda()
        dist_model.load_state_dict(plain_model.state_dict())
        plain_opt = torch.optim.SGD(plain_model.parameters(), lr=0.01, momentum=0.9)
        dist_opt = DistributedOptimizer(torch.optim.SGD(dist_model.parameters(), lr=0.01, momentum=0.9),
                                        named_parameters=dist_model.named_parameters())
        x = torch.randn(64, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (64,), device="cuda")
        loss_fn = torch.nn.CrossEntropyLoss()

        ddp_model = build().cuda()
        ddp_model.load_state_dict(plain_model.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(ddp_model, device_ids=[0])
        ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        goal = GOALS["train_overhead"]
        for key, model, opt, what in (("train_step", dist_model, dist_opt, "Perseus DistributedOptimizer"),
                                      ("train_step_ddp", ddp, ddp_opt,
                                       "torch DistributedDataParallel (NCCL, world size 1)")):
            sa, sb = interleaved(training_step(model, opt, loss_fn, x, y),
                                 training_step(plain_model, plain_opt, loss_fn, x, y), self.args.steps,
                                 torch, warmup=5)
            overhead = median(sa) / median(sb) - 1
            self.row("ResNet-50 training step, batch 64 (%s): %s vs plain" % (source, what),
                     median(sa), median(sb), 1 + overhead, "%+.2f %%" % (overhead * 100),
                     "overhead <= %d %%" % (goal * 100) if key == "train_step" else "(for comparison)",
                     overhead <= goal, key)
            self.notes.append("training step overhead, %s: %+.2f %% of %.1f ms"
                              % (what, overhead * 100, median(sb) * 1e3))

    def run(self):
        for case in (self.allreduce_sizes, self.resnet_set, self.optimizer_set, self.pack_unpack,
                     self.training_step):
            try:
                case()
            except Exception as e:  # one broken case must not hide the others' numbers
                self.errors.append("%s failed: %s: %s" % (case.__name__, type(e).__name__, e))
        if self.hvd.is_initialized():
            self.hvd.shutdown()


# ---------------------------------------------------------------- np=2 on one GPU (--shared-np2)

SHARED_GOALS = {"4k": GOALS["4k"], "large": GOALS["64m"], "optimizer_set": 2.0}
MULTI_RANK_NCCL = 23000  # NCCL 2.30.0, the first that runs two ranks on one GPU (with the variable)
CAVEAT = ("Both ranks time-slice one GPU (and NCCL's kernels of ranks sharing it spin while they wait "
          "for each other), so absolute times are not those of two GPUs: only the ratios within one run "
          "count.")
REQUIRED = ("run each rank with an NCCL of 2.30 or later for torch and Perseus alike: perseusrun -np 2 python "
            "benchmarks/gpu_bench.py --shared-np2 --nccl DIR/libnccl.so.2 (e.g. xz -dc "
            "../shared/nccl/libnccl-2.32.3-sm90.so.2.xz > DIR/libnccl.so.2)")


class LaunchError(Exception):
    """Launched in a way --shared-np2 cannot measure: exit code 2, with what to do."""


def preload_nccl(path):
    """--nccl: runs this process again with `path` preloaded, unless it already is. A
    preloaded object whose soname is libnccl.so.2 satisfies libtorch_cuda's NEEDED entry
    and is first in the global lookup scope; LD_LIBRARY_PATH cannot do it, since
    torch/__init__.py loads its wheel's copy by full path before libtorch_cuda."""
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        raise LaunchError("--nccl %s: no such file (an .xz must be unpacked first: xz -dc FILE.xz > "
                          "DIR/libnccl.so.2)" % path)
    os.environ["PERSEUS_NCCL_LIB"] = real  # the same file, so one copy serves both
    os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    preloaded = os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
    if real in (os.path.realpath(p) for p in preloaded):
        return
    os.environ["LD_PRELOAD"] = " ".join([real] + preloaded)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable] + sys.argv)


def mapped_file(address):
    """The file mapped at `address` in this process (None if none)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) > 5 else None
    return None


def mapped_nccls():
    with open("/proc/self/maps") as f:
        return sorted({line.split(None, 5)[5].strip() for line in f
                       if len(line.split(None, 5)) > 5 and "libnccl.so" in line.split(None, 5)[5]})


def global_nccl():
    """(version code, file) of the ncclGetVersion in the process's global namespace:
    where the dynamic linker binds libtorch_cuda's NCCL calls from (an LD_PRELOADed copy
    comes first). (0, None) when there is none: torch's wheel copy, which torch/__init__.py
    loads RTLD_LOCAL, is not there."""
    import ctypes
    try:
        fn = ctypes.CDLL(None).ncclGetVersion
    except AttributeError:
        return 0, None
    code = ctypes.c_int(0)
    if fn(ctypes.byref(code)) != 0:
        return 0, None
    return code.value, mapped_file(ctypes.cast(fn, ctypes.c_void_p).value)


def version_text(code):
    return "%d.%d.%d" % (code // 10000, code // 100 % 100, code % 100) if code else "?"


def perseus_nccl():
    """(path, version code, whether Perseus runs ranks sharing a GPU on NCCL, the why)
    from the core's account (perseus.common.gpu.describe())."""
    import re
    from perseus.common import gpu
    text = gpu.describe()
    found = re.search(r"^NCCL: (\S+) \(version ([\d.]+)\)", text, re.M)
    shared = re.search(r"^Ranks sharing a GPU: (.*)$", text, re.M)
    code = 0
    if found:
        major, minor, patch = (int(x) for x in found.group(2).split(".")[:3])
        code = major * 10000 + minor * 100 + patch
    why = shared.group(1) if shared else text.strip().replace("\n", "; ")
    return (found.group(1) if found else None), code, bool(shared and why.startswith("use NCCL")), why


class SharedBench:
    """The --shared-np2 rows: every sample taken by both ranks together after a barrier,
    the slower rank's time kept."""

    def __init__(self, args, torch, tdist, hvd, device, base_group, base_name, nccl_group):
        self.args, self.torch, self.tdist, self.hvd = args, torch, tdist, hvd
        self.device, self.base_group, self.base_name, self.nccl_group = device, base_group, base_name, nccl_group
        self.rank = hvd.rank()
        self.rows, self.samples, self.notes, self.errors = [], {}, [], []
        self._gathers = 0

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def wall(self, fn):
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0

    def timed(self, fns, iters):
        """{key: [seconds]} of the slower rank, the keys' order rotated each round."""
        keys = list(fns)
        for _ in range(self.args.warmup):
            for key in keys:
                self.hvd.barrier()
                fns[key]()
        self.sync()
        mine = {key: [] for key in keys}
        for i in range(iters):
            for key in keys[i % len(keys):] + keys[:i % len(keys)]:
                self.hvd.barrier()
                mine[key].append(self.wall(fns[key]))
        flat = self.torch.tensor([t for key in keys for t in mine[key]], dtype=self.torch.float64)
        self._gathers += 1
        flat = self.hvd.allreduce(flat, op=self.hvd.Max, name="bench.shared.times.%d" % self._gathers)
        return {key: flat[i * iters:(i + 1) * iters].tolist() for i, key in enumerate(keys)}

    def check(self, tensors, value, what):
        for t in tensors:
            if not bool((t == value).all()):
                wrong = t[t != value].flatten()[0].item()
                self.errors.append("rank %d: %s: wrong result (expected every element %r, one is %r)"
                                   % (self.rank, what, value, wrong))
                return

    def row(self, name, perseus, baseline, goal, key, samples=None):
        ratio = perseus / baseline
        self.rows.append((name, perseus, baseline, "%.3fx" % ratio,
                          "<= %.2fx" % goal if goal else "(side by side)",
                          None if goal is None else ratio <= goal))
        self.samples[key] = dict(samples or {}, perseus=perseus, baseline=baseline, ratio=ratio)

    def base_all_reduce(self, tensor):
        self.tdist.all_reduce(tensor, group=self.base_group)

    def exact_sums(self, run, tensors, what):
        """The timed loops reduce +1 (rank 0) and -1 (rank 1), a fixed point of 0 that a
        skipped call would not leave; then once more 1 and 2, which must give 3."""
        self.check(tensors, 0.0, what + ", timed calls")
        for t in tensors:
            t.fill_(self.rank + 1)
        run()
        self.sync()
        self.check(tensors, 3.0, what + ", a call of 1 and 2")

    def allreduce_sizes(self):
        torch, hvd = self.torch, self.hvd
        sign = 1.0 - 2 * self.rank
        for nbytes, key, label in ((4 * KiB, "4k", "4 KiB"),
                                   (self.args.large_mib * MiB, "large", "%d MiB" % self.args.large_mib)):
            mine = torch.full((nbytes // 4,), sign, device=self.device)
            theirs = torch.full((nbytes // 4,), sign, device=self.device)
            name = "bench.shared.ar.%d" % nbytes
            fns = {"perseus": lambda: hvd.allreduce_(mine, name=name, op=hvd.Sum),
                   "base": lambda: self.base_all_reduce(theirs)}
            iters = self.args.iters if nbytes <= MiB else max(2, self.args.iters // 4)
            got = self.timed(fns, iters)

            def both():
                for fn in fns.values():
                    fn()
            self.exact_sums(both, [mine, theirs], "allreduce %s" % label)
            self.row("allreduce %s in place (Sum, np=2) vs %s all_reduce" % (label, self.base_name),
                     median(got["perseus"]), median(got["base"]), SHARED_GOALS[key], key,
                     dict(perseus_samples=got["perseus"], baseline_samples=got["base"]))

    def optimizer_set(self):
        torch, hvd = self.torch, self.hvd
        from perseus.torch.optimizer import DistributedOptimizer
        sign = 1.0 - 2 * self.rank
        shapes = [(max(1, s[0] // self.args.set_divisor),) + tuple(s[1:]) for s in RESNET50_SHAPES]
        numel = sum(math.prod(s) for s in shapes)
        params = [torch.nn.Parameter(torch.zeros(s, device=self.device)) for s in shapes]
        opt = DistributedOptimizer(torch.optim.SGD(params, lr=0.0),
                                   named_parameters=[("p%d" % i, p) for i, p in enumerate(params)],
                                   op=hvd.Sum, gradient_as_bucket_view=True)
        for p in params:
            p.grad = torch.full_like(p, sign)
        flat = torch.full((numel,), sign, device=self.device)
        fns = {"perseus": opt.synchronize, "base": lambda: self.base_all_reduce(flat)}
        got = self.timed(fns, max(2, self.args.iters // 5))

        def both():
            for fn in fns.values():
                fn()
        self.exact_sums(both, [p.grad for p in params] + [flat], "optimizer set")
        buckets = len(opt._buckets.buckets) if opt._buckets is not None else 0
        self.row("ResNet-50 set (%d tensors, %.1f MiB) through DistributedOptimizer.synchronize() "
                 "(gradient views, %d buckets) vs 1 flat %s all_reduce"
                 % (len(shapes), numel * 4 / MiB, buckets, self.base_name),
                 median(got["perseus"]), median(got["base"]), SHARED_GOALS["optimizer_set"],
                 "optimizer_set", dict(perseus_samples=got["perseus"], baseline_samples=got["base"]))

    def training(self):
        torch, args = self.torch, self.args
        from torch.nn.parallel import DistributedDataParallel as TorchDDP
        from perseus.torch.nn.parallel import DistributedDataParallel as PerseusDDP
        from perseus.torch.optimizer import DistributedOptimizer
        build, source, shape, classes = model_constructor(args.model)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        torch.manual_seed(0)  # every rank and every variant starts from these weights
        first = build().to(self.device)
        initial = torch.cat([p.detach().flatten() for p in first.parameters()])
        ids = [self.device.index] if self.device.type == "cuda" else None

        def copy():
            model = build().to(self.device)
            model.load_state_dict(first.state_dict())
            return model

        def sgd(params):
            return torch.optim.SGD(params, lr=0.01, momentum=0.9)

        variants = {}  # key -> (title, module, its parameters' owner, optimizer)
        m = copy()
        variants["plain"] = ("plain torch (no communication)", m, m, sgd(m.parameters()))
        m = copy()
        variants["dopt"] = ("DistributedOptimizer", m, m,
                            DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters()))
        m = PerseusDDP(copy(), device_ids=ids)
        variants["dropin"] = ("Perseus's drop-in DDP", m, m.module, sgd(m.parameters()))
        if self.nccl_group is not None:
            m = TorchDDP(copy(), device_ids=ids, process_group=self.nccl_group)
            variants["torch_nccl"] = ("torch DDP on NCCL", m, m.module, sgd(m.parameters()))
        else:
            self.notes.append("torch DDP on NCCL: skipped: no CUDA device (--device cpu, a smoke run of "
                              "this script's code); it runs on a GPU only")
        m = TorchDDP(copy(), device_ids=ids)  # the default group: "perseus"
        variants["torch_perseus"] = ('torch DDP on "perseus"', m, m.module, sgd(m.parameters()))

        g = torch.Generator().manual_seed(1 + self.rank)  # each rank its own batch
        x = torch.randn((args.batch,) + shape, generator=g).to(self.device)
        y = torch.randint(0, classes, (args.batch,), generator=g).to(self.device)
        loss_fn = torch.nn.CrossEntropyLoss()

        steps = {k: training_step(v[1], v[3], loss_fn, x, y) for k, v in variants.items()}
        # One step of each alone first: a variant that fails on some rank is left out on
        # both, so that the others are still measured.
        ok = []
        for key in list(steps):
            try:
                self.hvd.barrier()
                steps[key]()
                self.sync()
                ok.append(1)
            except Exception as e:
                self.errors.append("rank %d: %s: its first step failed: %s: %s"
                                   % (self.rank, variants[key][0], type(e).__name__, e))
                ok.append(0)
        agreed = self.hvd.allreduce(torch.tensor(ok, dtype=torch.int32), op=self.hvd.Min,
                                    name="bench.shared.variants")
        for key, good in zip(list(steps), agreed.tolist()):
            if not good:
                del steps[key], variants[key]
        reference = next((k for k in ("torch_nccl", "torch_perseus", "dopt", "dropin") if k in variants), None)
        if reference is None or "plain" not in variants:
            self.errors.append("rank %d: training: too few variants left to compare" % self.rank)
            return
        got = self.timed(steps, args.steps)
        self.check_training(variants, initial, reference)
        what = "%s training step, batch %d per rank (%s)" % (args.model, args.batch, source)
        for key in [k for k in ("dopt", "dropin", "torch_perseus", "torch_nccl") if k in variants and k != reference]:
            self.row("%s: %s vs %s" % (what, variants[key][0], variants[reference][0]),
                     median(got[key]), median(got[reference]), None, "train_%s" % key,
                     dict(perseus_samples=got[key], baseline_samples=got[reference]))
        self.row("%s: %s vs %s" % (what, variants[reference][0], variants["plain"][0]),
                 median(got[reference]), median(got["plain"]), None, "train_%s_vs_plain" % reference,
                 dict(perseus_samples=got[reference], baseline_samples=got["plain"]))

    def check_training(self, variants, initial, reference):
        """Each reducing variant's ranks hold the same parameters (plain's must differ:
        the ranks' batches differ), and its change from the initial weights is torch
        DDP's, up to summation order."""
        torch, hvd = self.torch, self.hvd
        flat = {k: torch.cat([p.detach().flatten() for p in v[2].parameters()]) for k, v in variants.items()}
        keys = list(flat)
        prints = torch.tensor([[float(flat[k].double().sum()), float(flat[k].double().abs().sum())]
                               for k in keys], dtype=torch.float64)
        high = hvd.allreduce(prints, op=hvd.Max, name="bench.shared.prints.max")
        low = hvd.allreduce(prints, op=hvd.Min, name="bench.shared.prints.min")
        spread = ((high - low).abs() / high.abs().clamp(min=1.0)).max(dim=1).values.tolist()
        for key, s in zip(keys, spread):
            title = variants[key][0]
            if key == "plain":
                if s == 0:
                    self.errors.append("rank %d: plain torch's parameters are the same on both ranks: the "
                                       "ranks' batches do not differ, so agreement proves nothing" % self.rank)
            elif s > 1e-7:
                self.errors.append("rank %d: %s: the ranks' parameters differ after training (relative "
                                   "%.3g)" % (self.rank, title, s))
        ref = flat[reference] - initial
        norm = float(ref.norm())
        for key in keys:
            if key in ("plain", reference):
                continue
            off = float((flat[key] - initial - ref).norm()) / max(norm, 1e-30)
            self.samples["train_%s_update_vs_%s" % (key, reference)] = off
            self.notes.append("%s: its change to the weights is %s's within %.2g (relative)"
                              % (variants[key][0], variants[reference][0], off))
            if not off <= 0.05:
                self.errors.append("rank %d: %s: its change to the weights differs from %s's by %.3g "
                                   "(relative; at most 0.05)" % (self.rank, variants[key][0],
                                                                 variants[reference][0], off))

    def run(self):
        for case in (self.allreduce_sizes, self.optimizer_set, self.training):
            try:
                case()
            except Exception as e:  # one broken case must not hide the others' numbers
                self.errors.append("rank %d: %s failed: %s: %s" % (self.rank, case.__name__, type(e).__name__, e))


def render_shared(bench, env):
    lines = ["### GPU benchmark, np=2 on one GPU" if bench.device.type == "cuda"
             else "### GPU benchmark, np=2, CPU smoke run (--device cpu: no GPU measured)", "",
             env, "", "**%s%s**" % ("" if bench.device.type == "cuda" else "On a GPU: ", CAVEAT), "",
             "| measurement | Perseus | baseline | ratio | goal | met |",
             "|---|---:|---:|---:|---|---|"]
    for name, perseus, baseline, shown, goal, met in bench.rows:
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            name, fmt_time(perseus), fmt_time(baseline), shown, goal,
            "-" if met is None else "yes" if met else "**no**"))
    lines.append("")
    lines += ["- %s" % note for note in bench.notes]
    lines += ["- ERROR: %s" % e for e in bench.errors]
    return "\n".join(lines)


def model_constructor(name):
    """(constructor, where it came from, input shape, classes) of a training row's model."""
    if name == "resnet50":
        build, source = resnet50_constructor()
        return build, source, (3, 224, 224), 1000
    sys.path.insert(0, os.path.join(REPO, "examples", "pytorch"))
    import models
    return models.resnet_small, "examples/pytorch/models.py", (3, 32, 32), 10


def shared_environment(torch, hvd, device):
    """The NCCL checks of --shared-np2 (LaunchError when one fails) -> the table's
    environment line."""
    if device.type == "cpu":
        return "CPU tensors, torch %s; gloo stands in for NCCL" % torch.__version__
    built = getattr(torch.cuda, "nccl", None)
    built = tuple(built.version()[:3]) if built else (0, 0, 0)
    torch_code, torch_file = global_nccl()
    mapped = mapped_nccls()
    if torch_code:
        where = ("torch's NCCL calls reach %s (NCCL %s, ncclGetVersion in the global namespace)"
                 % (torch_file, version_text(torch_code)))
    elif len(mapped) == 1:
        # Nothing global: the wheel's copy, loaded RTLD_LOCAL, is torch's; torch pins the
        # wheel it was built against, so its headers' version is that copy's.
        torch_file, torch_code = mapped[0], built[0] * 10000 + built[1] * 100 + built[2]
        where = "torch's NCCL calls reach its wheel's copy %s (NCCL %s, as built)" % (torch_file,
                                                                                    version_text(torch_code))
    else:
        where = "torch's NCCL calls reach a copy not in the global namespace, one of %s" % (mapped or "none")
    built = ".".join(map(str, built)) if any(built) else "?"
    env = "%s; torch %s (CUDA %s; torch.cuda.nccl.version() %s: the headers torch was built with); %s" % (
        torch.cuda.get_device_name(0), torch.__version__, torch.version.cuda, built, where)
    if os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") != "1":
        raise LaunchError("NCCL_MULTI_RANK_GPU_ENABLE is not 1, so NCCL refuses two ranks on one GPU; "
                          + REQUIRED)
    if torch_code < MULTI_RANK_NCCL:
        raise LaunchError("%s: NCCL before 2.30 refuses two ranks on one GPU (\"Duplicate GPU "
                          "detected\"); %s" % (where, REQUIRED))
    path, code, shared, why = perseus_nccl()
    if path is None or not shared:
        raise LaunchError("Perseus would not run ranks sharing a GPU on NCCL (%s); %s" % (why, REQUIRED))
    if torch_file is None or not os.path.samefile(path, torch_file):
        raise LaunchError("Perseus loaded %s, torch calls %s: two copies of NCCL, not one; set "
                          "PERSEUS_NCCL_LIB to the preloaded file (--nccl does)" % (path, torch_file))
    others = [f for f in mapped if not os.path.samefile(f, path)]
    return env + "; Perseus: the same file (NCCL %s)%s" % (
        version_text(code), "; also mapped, unused: %s (torch/__init__.py loads its wheel's copy "
        "RTLD_LOCAL)" % ", ".join(others) if others else "")


def main_shared(args):
    """--shared-np2 -> exit code."""
    if args.nccl and args.device == "cuda":
        preload_nccl(args.nccl)  # returns once this process has it preloaded
    import faulthandler
    faulthandler.dump_traceback_later(args.timeout, exit=True)  # a hang must not eat device time
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_bench: no CUDA device visible to torch %s (torch.version.cuda=%s): nothing to measure "
              "(--device cpu runs this mode's code on CPU tensors)." % (torch.__version__, torch.version.cuda))
        return 0
    import torch.distributed as tdist
    try:
        import perseus.torch  # noqa: F401 - registers the "perseus" backend
    except ImportError:  # a source checkout built in place, not installed
        sys.path.insert(0, REPO)
        import perseus.torch  # noqa: F401
    import perseus.torch.horovod as hvd

    hvd.init()
    if hvd.size() != 2:
        print("gpu_bench: --shared-np2 needs exactly 2 ranks (this is rank %d of %d): perseusrun -np 2 python "
              "benchmarks/gpu_bench.py --shared-np2 ..." % (hvd.rank(), hvd.size()), file=sys.stderr)
        return 2
    rank = hvd.rank()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        env = shared_environment(torch, hvd, device)
        tdist.init_process_group("perseus")  # the default group; ranks and store from Perseus
        if device.type == "cuda":
            base = tdist.new_group(backend="nccl")
            probe = torch.full((1024,), float(rank + 1), device=device)
            try:
                tdist.all_reduce(probe, group=base)
                torch.cuda.synchronize()
            except Exception as e:
                raise LaunchError("torch's NCCL group failed its first all_reduce with two ranks on GPU 0: "
                                  "%s: %s" % (type(e).__name__, e))
            if not bool((probe == 3.0).all()):
                raise LaunchError("torch's NCCL group's first all_reduce of 1 and 2 gave %r, not 3"
                                  % probe[0].item())
            bench = SharedBench(args, torch, tdist, hvd, device, base, "NCCL", base)
        else:
            base = tdist.new_group(backend="gloo")
            bench = SharedBench(args, torch, tdist, hvd, device, base, "gloo (the CPU stand-in for NCCL)", None)
    except LaunchError as e:
        print("gpu_bench [rank %d]: cannot measure --shared-np2: %s" % (rank, e), file=sys.stderr, flush=True)
        faulthandler.dump_traceback_later(30, exit=True)  # an exit stuck in NCCL's or MPI's teardown
        return 2
    bench.run()
    # Every rank's errors count: the exit code and rank 0's report say how many there were.
    count = hvd.allreduce(torch.tensor([len(bench.errors)], dtype=torch.int64), op=hvd.Sum,
                          name="bench.shared.errors")
    for e in (bench.errors if rank != 0 else ()):
        print("gpu_bench [rank %d] ERROR: %s" % (rank, e), flush=True)
    theirs = int(count.item()) - len(bench.errors)
    if theirs:
        bench.errors.append("rank 1 reported %d error(s) of its own (its output, above)" % theirs)
    if rank == 0:  # before the teardown, so that a teardown that hangs loses no figure
        print(render_shared(bench, env), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"env": env, "caveat": CAVEAT, "rows": bench.rows, "samples": bench.samples,
                           "notes": bench.notes, "errors": bench.errors, "goals": SHARED_GOALS}, f,
                          indent=1, default=str)
    faulthandler.dump_traceback_later(60, exit=True)
    tdist.destroy_process_group()
    hvd.shutdown()
    faulthandler.cancel_dump_traceback_later()
    return 1 if int(count.item()) else 0


def resnet50_constructor():
    """(constructor, where it came from): torchvision if installed, else the local copy
    with torchvision's parameter shapes (examples/pytorch/models.py)."""
    try:
        import torchvision
        return (lambda: torchvision.models.resnet50(weights=None)), "torchvision %s" % torchvision.__version__
    except ImportError:
        sys.path.insert(0, os.path.join(REPO, "examples", "pytorch"))
        import models
        return models.resnet50, "examples/pytorch/models.py"


def fmt_time(s):
    if s != s:  # NaN
        return "n/a"
    return "%.1f us" % (s * 1e6) if s < 1e-3 else "%.3f ms" % (s * 1e3)


def render(bench, env):
    lines = ["### GPU benchmark (np=1)", "",
             "%s" % env, "",
             "| measurement | Perseus | baseline | ratio | goal | met |",
             "|---|---:|---:|---:|---|---|"]
    for name, perseus, baseline, shown, goal, met in bench.rows:
        lines.append("| %s | %s | %s | %s | %s | %s |" % (name, fmt_time(perseus), fmt_time(baseline), shown,
                                                          goal, "yes" if met else "**no**"))
    lines.append("")
    lines += ["- %s" % note for note in bench.notes]
    lines += ["- ERROR: %s" % e for e in bench.errors]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.shared_np2:
        try:
            return main_shared(args)
        except LaunchError as e:  # --nccl's file is missing
            print("gpu_bench: cannot measure --shared-np2: %s" % e, file=sys.stderr)
            return 2
    if args.nccl:
        try:
            preload_nccl(args.nccl)
        except LaunchError as e:
            print("gpu_bench: %s" % e, file=sys.stderr)
            return 2
    import torch
    if not torch.cuda.is_available():
        print("gpu_bench: no CUDA device visible to torch %s (torch.version.cuda=%s): nothing to measure."
              % (torch.__version__, torch.version.cuda))
        return 0
    import torch.distributed as dist
    try:
        import perseus.torch.horovod as hvd
    except ImportError:  # a source checkout built in place, not installed
        sys.path.insert(0, REPO)
        import perseus.torch.horovod as hvd

    torch.cuda.set_device(0)
    # The FileStore creates its file: a fresh name in a folder only we can write (a name
    # freed in /tmp could be taken, or linked, by someone else before the store opens it).
    store_dir = tempfile.mkdtemp(prefix="gpu_bench_")
    dist.init_process_group("nccl", init_method="file://" + os.path.join(store_dir, "store"),
                            rank=0, world_size=1)
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
    env = "%s; torch %s (CUDA %s, NCCL %s)" % (torch.cuda.get_device_name(0), torch.__version__,
                                               torch.version.cuda, nccl)
    hvd.init()
    if hvd.size() != 1:  # Perseus's sums would count every rank where torch's world is one
        print("gpu_bench: this mode measures one process (this is rank %d of %d); for two ranks on one GPU "
              "use perseusrun -np 2 python benchmarks/gpu_bench.py --shared-np2" % (hvd.rank(), hvd.size()),
              file=sys.stderr)
        return 2
    bench = Bench(args, torch, dist, hvd)
    bench.run()
    dist.destroy_process_group()
    shutil.rmtree(store_dir, ignore_errors=True)
    print(render(bench, env), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "rows": bench.rows, "samples": bench.samples, "notes": bench.notes,
                       "errors": bench.errors, "goals": GOALS}, f, indent=1, default=str)
    return 1 if bench.errors else 0


if __name__ == "__main__":
    sys.exit(main())
