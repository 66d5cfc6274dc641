"""End-to-end CPU training throughput: Perseus against torch DDP (gloo), at 1 and 2
ranks, in one run, on the same synthetic model and data.

    python benchmarks/training_scaling.py [--repeat 3] [--iters 30] [--model mlp]

The driver launches `mpirun -np N python this_file --worker ...` for each
(backend, N), one thread per rank, and prints a table of samples/sec with the
scaling efficiency throughput(np=2) / (2 x throughput(np=1)). Repeats alternate
the backends so drift in this noisy machine hits both alike; the table shows
medians.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


# ---- the model ------------------------------------------------------------------

def build_model(name):
    import torch.nn as nn
    if name == "mlp":  # ~2.4 M parameters in 4 tensors pairs: dominated by compute
        return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 256), nn.ReLU(), nn.Linear(256, 10)), (1024,)
    if name == "convnet":  # small CNN on 32x32 images, many small gradients
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(128 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10)), (3, 32, 32)
    raise SystemExit("unknown model %r (choose mlp or convnet)" % name)


# ---- one rank ---------------------------------------------------------------------

def launcher_rank_size():
    for r, s in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    return 0, 1


def worker(args):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, shape = build_model(args.model)
    rank, size = launcher_rank_size()
    if args.backend == "perseus":
        import perseus.torch.horovod as hvd
        hvd.init()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        train_model = model
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=size)
        train_model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(train_model.parameters(), lr=0.01, momentum=0.9)
    data = torch.randn(args.batch_size, *shape)
    target = torch.randint(0, 10, (args.batch_size,))

    def step():
        opt.zero_grad()
        F.cross_entropy(train_model(data), target).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    start = time.perf_counter()
    for _ in range(args.iters):
        step()
    elapsed = time.perf_counter() - start
    if rank == 0:
        rate = args.iters * args.batch_size * size / elapsed
        print("RESULT " + json.dumps({"backend": args.backend, "np": size, "samples_per_s": rate}),
              flush=True)
    if args.backend == "perseus":
        hvd.shutdown()
    else:
        dist.destroy_process_group()


# ---- the driver -------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(backend, nprocs, args):
    mpirun = Path(sys.executable).parent / "mpirun"
    cmd = [str(mpirun if mpirun.exists() else "mpirun"), "-np", str(nprocs), sys.executable,
           str(HERE), "--worker", "--backend", backend, "--model", args.model,
           "--batch-size", str(args.batch_size), "--iters", str(args.iters),
           "--warmup", str(args.warmup)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])["samples_per_s"]
    raise SystemExit("%s np=%d failed:\n%s\n%s" % (backend, nprocs, out.stdout, out.stderr))


def driver(args):
    rates = {(b, n): [] for b in ("perseus", "ddp") for n in (1, 2)}
    for r in range(args.repeat):
        order = ("perseus", "ddp") if r % 2 == 0 else ("ddp", "perseus")
        for backend in order:
            for n in (1, 2):
                rates[(backend, n)].append(run_one(backend, n, args))
    print("model %s, batch %d per rank, %d iterations, %d repeats, 1 thread per rank\n"
          % (args.model, args.batch_size, args.iters, args.repeat))
    print("| backend | np=1 samples/s | np=2 samples/s | scaling efficiency |")
    print("|---|---:|---:|---:|")
    summary = {}
    for backend in ("perseus", "ddp"):
        one = statistics.median(rates[(backend, 1)])
        two = statistics.median(rates[(backend, 2)])
        eff = statistics.median(t / (2 * o) for o, t in zip(rates[(backend, 1)],
                                                             rates[(backend, 2)]))
        summary[backend] = eff
        print("| %s | %.0f | %.0f | %.3f |" % (backend, one, two, eff))
    print("\nperseus np=2 throughput / ddp np=2 throughput: %.3f" % (
        statistics.median(rates[("perseus", 2)]) / statistics.median(rates[("ddp", 2)])))
    if args.json:
        Path(args.json).write_text(json.dumps({"rates": {"%s.np%d" % k: v for k, v in rates.items()},
                                               "efficiency": summary}, indent=1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=("perseus", "ddp"), default="perseus")
    p.add_argument("--model", default="convnet", help="mlp or convnet")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="write every rate here")
    args = p.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
