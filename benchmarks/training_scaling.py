"""End-to-end CPU training throughput: Perseus against torch DDP (gloo), at 1 and 2
ranks, in one run, on the same synthetic model and data.

    python benchmarks/training_scaling.py [--repeat 5] [--iters 40] [--model resnet_small]

The models are the synthetic benchmark's (examples/pytorch/models.py). The driver
launches `mpirun -np N python this_file --worker ...` for each (backend, N), one
thread per rank, and prints a table of samples/sec with the scaling efficiency
throughput(np=2) / (2 x throughput(np=1)). A third backend, "plain", trains the
same model with no communication at all: its np=2 row is the ceiling two busy
cores allow, and "vs plain" divides each backend's np=2 rate by it. Repeats
rotate the backend order so drift in this noisy machine hits all alike; the
table shows medians.

    python benchmarks/training_scaling.py --autotune [--autotune-np 2] [--pairs 3]

instead trains with Perseus only, in one mpirun job: PERSEUS_AUTOTUNE's settled
throughput against a sweep of fixed settings (autotune_compare.py).
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
    """(model, input shape, classes) from the synthetic benchmark's model table."""
    sys.path.insert(0, str(HERE.parent.parent / "examples" / "pytorch"))
    import models
    if name not in models.MODELS:
        raise SystemExit("unknown model %r (choose from %s)" % (name, ", ".join(models.MODELS)))
    build, shape, classes = models.MODELS[name]
    return build(), shape, classes


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
    model, shape, classes = build_model(args.model)
    rank, size = launcher_rank_size()
    if args.backend == "perseus":
        import perseus.torch.horovod as hvd
        hvd.init()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        train_model = model
    elif args.backend == "plain":  # no communication: the ceiling two busy cores allow
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        train_model = model
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=size)
        train_model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(train_model.parameters(), lr=0.01, momentum=0.9)
    data = torch.randn(args.batch_size, *shape)
    target = torch.randint(0, classes, (args.batch_size,))

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
    elif args.backend == "ddp":
        dist.destroy_process_group()


# ---- --autotune: autotune against a sweep of fixed settings ------------------------

def autotune_worker(args):
    """One rank of the comparison: each run of a setting trains a fresh model."""
    import torch
    import torch.nn.functional as F
    import perseus.torch.horovod as hvd
    import autotune_compare
    torch.set_num_threads(1)
    _, size = launcher_rank_size()

    def make_step():
        torch.manual_seed(0)
        model, shape, classes = build_model(args.model)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                       named_parameters=model.named_parameters())
        data = torch.randn(args.batch_size, *shape)
        target = torch.randint(0, classes, (args.batch_size,))

        def step():
            opt.zero_grad()
            F.cross_entropy(model(data), target).backward()
            opt.step()
        return step

    autotune_compare.compare(hvd, make_step, args.batch_size * size, "samples/s", args)


def autotune_driver(args):
    mpirun = Path(sys.executable).parent / "mpirun"
    cmd = [str(mpirun if mpirun.exists() else "mpirun"), "-np", str(args.autotune_np),
           sys.executable, str(HERE)] + [a for a in sys.argv[1:] if a != "--autotune"] + [
           "--autotune-worker"]
    print("model %s, batch %d per rank, %d ranks, 1 thread per rank"
          % (args.model, args.batch_size, args.autotune_np), flush=True)
    rc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1")).returncode
    if rc:
        raise SystemExit("the --autotune job failed (exit %d)" % rc)


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


BACKENDS = ("perseus", "ddp", "plain")


def driver(args):
    rates = {(b, n): [] for b in BACKENDS for n in (1, 2)}
    for r in range(args.repeat):
        order = BACKENDS[r % 3:] + BACKENDS[:r % 3]
        for backend in order:
            for n in (1, 2):
                rates[(backend, n)].append(run_one(backend, n, args))
    print("model %s, batch %d per rank, %d iterations, %d repeats, 1 thread per rank\n"
          % (args.model, args.batch_size, args.iters, args.repeat))
    print("| backend | np=1 samples/s | np=2 samples/s | scaling efficiency | np=2 vs plain |")
    print("|---|---:|---:|---:|---:|")
    summary = {}
    plain_two = rates[("plain", 2)]
    for backend in BACKENDS:
        one = statistics.median(rates[(backend, 1)])
        two = statistics.median(rates[(backend, 2)])
        # Per repeat, then the median: each repeat's runs sat close together in time.
        eff = statistics.median(t / (2 * o) for o, t in zip(rates[(backend, 1)],
                                                             rates[(backend, 2)]))
        vs_plain = statistics.median(t / p for t, p in zip(rates[(backend, 2)], plain_two))
        summary[backend] = eff
        print("| %s | %.0f | %.0f | %.3f | %.3f |" % (backend, one, two, eff, vs_plain))
    print("\nperseus np=2 throughput / ddp np=2 throughput: %.3f" % (
        statistics.median(rates[("perseus", 2)]) / statistics.median(rates[("ddp", 2)])))
    if args.json:
        Path(args.json).write_text(json.dumps({"rates": {"%s.np%d" % k: v for k, v in rates.items()},
                                               "efficiency": summary}, indent=1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=("perseus", "ddp", "plain"), default="perseus")
    p.add_argument("--model", default="resnet_small",
                   help="a model of examples/pytorch/models.py (resnet_small, mlp, ...)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", help="write every rate here")
    p.add_argument("--autotune", action="store_true",
                   help="Perseus only: autotune against a sweep of fixed settings")
    p.add_argument("--autotune-np", type=int, default=2, help="ranks for --autotune")
    p.add_argument("--autotune-worker", action="store_true", help=argparse.SUPPRESS)
    sys.path.insert(0, str(HERE.parent))
    import autotune_compare
    autotune_compare.add_arguments(p)
    args = p.parse_args()
    if args.autotune_worker:
        autotune_worker(args)
    elif args.autotune:
        autotune_driver(args)
    else:
        worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
