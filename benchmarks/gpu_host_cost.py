#!/usr/bin/env python
"""Host cost per GPU tensor, on a machine without a GPU (issue 31).

    python benchmarks/gpu_host_cost.py [--np 1,2] [--iters N] [--json PATH]

Pushes the ResNet-50 gradient set (161 float32 tensors, 25.6 M elements) through
Perseus's GPU path on the fake CUDA runtime and NCCL of tests/gpu_fakes in its timing
mode (FAKE_GPU_TIMING=1: copies and NCCL calls move nothing and return at once), so
what is left is Perseus's own host work: the torch front end's CUDA branch (with a
stand-in CUDA tensor), the enqueue (a ready event per request), negotiation, the hand-off
to the device lane, the lane's calls (event waits, packing, NCCL, completion event)
and the completion. Next to it, in the same run and with the same names and shapes,
the CPU path: the same 161 tensors with one element each, so that its per-tensor cost
is not hidden behind moving 97.5 MiB.

Without mpirun it runs itself under the venv's mpirun once per --np value and prints
one table; under mpirun it measures and rank 0 prints its rows. Rows, in µs per tensor
(medians over --iters iterations of all 161, the paths interleaved per iteration):

  torch, whole        hvd.allreduce_async_ of each tensor, then hvd.synchronize of each
  torch, gathered     DistributedOptimizer's path without gradient views: each tensor's
                      packed request reused (adapter.submit's fast path), gathered up to
                      the core's hold (1 MiB on a GPU, the fusion threshold on the CPU,
                      counting the set's real bytes on both) per enqueue, one
                      synchronize_all
  torch, bucket views DistributedOptimizer's default path (grad_buckets.py): the set laid
                      out in buckets as it lays them out (by the real bytes), one check
                      per tensor that its .grad is the view, one request per bucket
  C ABI, per tensor   one perseus_enqueue per tensor (requests packed beforehand), then
                      perseus_wait_all: the core alone
    of which enqueue  the time inside those perseus_enqueue calls
    of which after    the rest: negotiation, lane hand-off, lane calls, completion
  C ABI, one enqueue  all 161 in one perseus_enqueue (what a gathering front end does)
  torch front end     "torch, whole" minus "C ABI, per tensor"

Then, counted by the fake for one pass of the torch rows on the GPU path, the calls that
cost host time on a real GPU, per tensor: event records, stream waits, copies,
kernel launches, NCCL calls, device switches (each a runtime call on a real GPU).
"""

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from resnet50_shapes import RESNET50_SHAPES  # noqa: E402

ROWS = ["torch, whole", "torch, gathered", "torch, bucket views", "C ABI, per tensor",
        "  of which enqueue", "  of which after", "C ABI, one enqueue", "torch front end"]
PATHS = ("gpu", "cpu")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", default="1,2", help="world sizes to run (default 1,2)")
    p.add_argument("--iters", type=int, default=60, help="timed iterations (default 60)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--json", help="also write the medians here")
    return p.parse_args(argv)


# ---------------------------------------------------------------- the driver

def build_fake(folder):
    """The fake CUDA runtime and NCCL (tests/support/fake_gpu.py builds it), optimised."""
    from support import fake_gpu
    mpicc = os.path.join(os.path.dirname(sys.executable), "mpicc")
    if not os.path.exists(mpicc):
        mpicc = shutil.which("mpicc")
    return fake_gpu.build(mpicc, folder, flags=("-O2",))


def drive(args):
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if not os.path.exists(mpirun):
        mpirun = shutil.which("mpirun")
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        library = build_fake(folder)
        env = dict(os.environ, PERSEUS_CUDA_LIB=folder, PERSEUS_NCCL_LIB=folder, FAKE_GPU_DEVICE_DIR=folder,
                   FAKE_GPU_LIB=library, FAKE_GPU_TIMING="1", OMP_NUM_THREADS="1")
        for np in [int(x) for x in args.np.split(",")]:
            out = os.path.join(folder, "np%d.json" % np)
            cmd = [mpirun, "-np", str(np), sys.executable, os.path.abspath(__file__),
                   "--iters", str(args.iters), "--warmup", str(args.warmup), "--json", out]
            subprocess.run(cmd, env=env, check=True)
            with open(out) as f:
                results[np] = json.load(f)
    print("Host cost per tensor, ResNet-50 set (161 tensors), µs (medians of %d iterations);"
          " GPU on the fake CUDA/NCCL in timing mode, CPU with one element per tensor\n"
          % args.iters)
    header = "| row |" + "".join(" np=%d GPU | np=%d CPU |" % (np, np) for np in results)
    print(header)
    print("|---|" + "---:|---:|" * len(results))
    for row in ROWS:
        cells = "".join(" %.1f | %.1f |" % (r[row]["gpu"], r[row]["cpu"]) for r in results.values())
        print("| %s |%s" % (row.strip(), cells))
    print("\nGPU calls per tensor, one pass of each torch row (counted by the fake)\n")
    labels = ("calls", "calls, gathered", "calls, bucket views")
    print("| call |" + "".join(" np=%d whole | gathered | bucket views |" % np for np in results))
    print("|---|" + "---:|---:|---:|" * len(results))
    for kind in next(iter(results.values()))["calls"]:
        print("| %s |%s" % (kind, "".join("".join(" %.2f |" % r[label][kind] for label in labels)
                                         for r in results.values())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


# ---------------------------------------------------------------- one rank

class StandInCudaTensor:
    """What the torch adapter reads of a CUDA tensor, over a CPU tensor's memory (the
    fake's device memory is host memory)."""
    is_cpu = False
    is_cuda = True
    requires_grad = False

    def __init__(self, tensor):
        import torch
        self._tensor = tensor
        self.device = torch.device("cuda", 0)
        self.shape = tensor.shape
        self.dtype = tensor.dtype
        self.layout = tensor.layout

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return self._tensor.data_ptr()

    def untyped_storage(self):
        return self._tensor.untyped_storage()


def measure(args):
    import torch
    import perseus.torch.horovod as hvd
    from perseus.common import builder, ops
    from perseus.common import library as lib
    from perseus.common import requests
    from perseus.common.requests import synchronize_all
    from perseus.torch import adapter
    from perseus.torch import device as torch_device
    from perseus.torch.buckets import FIRST_BUCKET_BYTES, assign_buckets
    from perseus.torch.grad_buckets import BUCKET_BYTES
    from support import fake_gpu

    hvd.init()
    # The CUDA branch with the legacy stream (0) as every caller's current stream.
    torch_device.current_stream = lambda index: 0
    torch_device.consumer = lambda index: (lambda: 0)
    real_increment_version = adapter._increment_version
    # A stand-in has no version counter to bump (the real tensors' bumps are timed).
    adapter._increment_version = lambda tensors: real_increment_version(
        [t for t in tensors if not isinstance(t, StandInCudaTensor)])

    names = ["layer%03d.grad" % i for i in range(len(RESNET50_SHAPES))]
    data = {"gpu": [torch.zeros(shape) for shape in RESNET50_SHAPES],
            "cpu": [torch.zeros(1) for _ in RESNET50_SHAPES]}
    tensors = {"gpu": [StandInCudaTensor(t) for t in data["gpu"]], "cpu": data["cpu"]}

    def packed(path, per_tensor):
        device = 0 if path == "gpu" else ops.CPU_DEVICE
        reqs = [builder.Request(ops.ALLREDUCE, 0, ops.FLOAT32, tuple(t.shape), t.data_ptr(),
                                t.data_ptr(), ("%s.capi.%s" % (path, n)).encode(), ops.Sum,
                                device=device)
                for n, t in zip(names, data[path])]
        if per_tensor:
            return [builder.pack([r]) for r in reqs]
        return [builder.pack(reqs)]

    bufs = {(path, per): packed(path, per) for path in PATHS for per in (True, False)}
    wait_all = lib.perseus_wait_all
    release = lib.perseus_release
    index = ctypes.c_int32(-1)

    def capi(path, per_tensor):
        import array
        handles = array.array("q")
        inside = 0.0
        t0 = time.perf_counter()
        for buf, n in bufs[(path, per_tensor)]:
            a = time.perf_counter()
            got, _ = requests.enqueue((buf, n))
            inside += time.perf_counter() - a
            handles.extend(got)
        status = wait_all(handles.buffer_info()[0], len(handles), 60.0, ctypes.byref(index))
        assert status == 0, lib.error(status)
        total = time.perf_counter() - t0
        if path == "gpu":
            for h in handles:
                lib.perseus_stream_wait(h, None)
        for h in handles:
            release(h)
        return total, inside

    hold = {path: hvd.global_process_set.hold(gpu=path == "gpu")[0] for path in PATHS}
    nbytes = [t.numel() * 4 for t in data["gpu"]]  # the set's real bytes, for both paths

    def gathered(path):
        t0 = time.perf_counter()
        handles, batch, batch_names, size = [], [], [], 0
        for n, tensor, tensor_bytes in zip(names, tensors[path], nbytes):
            batch.append(tensor)
            batch_names.append("%s.opt.%s" % (path, n))
            size += tensor_bytes
            if size >= hold[path]:
                handles.append(adapter.submit(ops.ALLREDUCE, batch, batch_names,
                                              hvd.global_process_set, inplace=True, pin=False))
                batch, batch_names, size = [], [], 0
        if batch:
            handles.append(adapter.submit(ops.ALLREDUCE, batch, batch_names,
                                          hvd.global_process_set, inplace=True, pin=False,
                                          drive=True))
        synchronize_all(handles)
        return time.perf_counter() - t0

    layout = assign_buckets(data["gpu"], BUCKET_BYTES, FIRST_BUCKET_BYTES)
    flats = {"gpu": [StandInCudaTensor(torch.zeros(sum(data["gpu"][i].numel() for i in members)))
                     for members in layout],
             "cpu": [torch.zeros(len(members)) for members in layout]}
    views = [object() for _ in names]
    grads = list(views)  # steady state: every .grad is its view

    def bucketed(path):
        t0 = time.perf_counter()
        handles = []
        for k, (members, flat) in enumerate(zip(layout, flats[path])):
            for i in members:  # GradBuckets.complete's look at each member
                if grads[i] is not views[i]:
                    raise AssertionError("not a view")
            handles.append(adapter.submit(ops.ALLREDUCE, (flat,), "%s.bucket%d" % (path, k),
                                          hvd.global_process_set, inplace=True, pin=False))
        synchronize_all(handles)
        return time.perf_counter() - t0

    def torch_path(path):
        t0 = time.perf_counter()
        hs = [hvd.allreduce_async_(t, name="%s.torch.%s" % (path, n), op=hvd.Sum)
              for n, t in zip(names, tensors[path])]
        for h in hs:
            hvd.synchronize(h)
        return time.perf_counter() - t0

    samples = {row: {p: [] for p in PATHS} for row in ROWS}
    count = len(names)
    for it in range(args.warmup + args.iters):
        for path in PATHS:
            whole = torch_path(path)
            gather = gathered(path)
            views_time = bucketed(path)
            per, inside = capi(path, True)
            one, _ = capi(path, False)
            if it < args.warmup:
                continue
            us = 1e6 / count
            for row, value in ((ROWS[0], whole), (ROWS[1], gather), (ROWS[2], views_time),
                               (ROWS[3], per), (ROWS[4], inside), (ROWS[5], per - inside),
                               (ROWS[6], one), (ROWS[7], whole - per)):
                samples[row][path].append(value * us)
    medians = {row: {p: statistics.median(v) for p, v in by_path.items()}
               for row, by_path in samples.items()}
    for label, run in (("calls", torch_path), ("calls, gathered", gathered),
                       ("calls, bucket views", bucketed)):
        before = fake_gpu.calls()
        run("gpu")
        after = fake_gpu.calls()
        medians[label] = {k: (after[k] - before[k]) / count for k in after}
    if hvd.rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(medians, f)
    hvd.shutdown()


def main():
    args = parse_args()
    launched = any(v in os.environ for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))
    if launched:
        measure(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
