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
"""

import argparse
import json
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

        def step(model, opt):
            def run():
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
            return run

        ddp_model = build().cuda()
        ddp_model.load_state_dict(plain_model.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(ddp_model, device_ids=[0])
        ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        goal = GOALS["train_overhead"]
        for key, model, opt, what in (("train_step", dist_model, dist_opt, "Perseus DistributedOptimizer"),
                                      ("train_step_ddp", ddp, ddp_opt,
                                       "torch DistributedDataParallel (NCCL, world size 1)")):
            sa, sb = interleaved(step(model, opt), step(plain_model, plain_opt), self.args.steps,
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
