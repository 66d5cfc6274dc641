"""Training step time of Perseus's DistributedDataParallel against torch's
DistributedDataParallel over gloo, on the same CPU models, in one run.

    mpirun -np 2 python benchmarks/ddp_bench.py [--repeat 5] [--iters 30] [--json PATH]

Both DDPs live in the same processes (one torch thread per rank), wrap copies of
the same model, and train on the same data with SGD. A round times one block of
--iters steps per backend and model; the order of the backends alternates from
round to round, so drift on this shared machine hits both alike. Before a block
each backend runs its own barrier; a block's step time is its wall time / iters,
the maximum over the ranks (a step is done when every rank is). The table gives
the medians over rounds and the median of the per-round ratios Perseus / torch.

Models:
  many_small  40 blocks of Linear(64, 64) + BatchNorm1d(64): 160 parameter tensors
              (about 0.17 M parameters) and 120 buffers, little compute per step,
              so communication latency and per-tensor overhead dominate;
  large       models.mlp(hidden=2048): three tensors of up to 16 MiB (5.8 M
              parameters), so bandwidth dominates.

Goals (issue 4): Perseus <= 0.8x torch's step time on many_small, and no worse on
large. After timing, the two copies of each model must still agree (they trained
on the same data), or the run stops: a fast wrong answer is not a result.
"""
import argparse
import copy
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def launcher_rank_size():
    for r, s in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    return 0, 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_models(args):
    import torch.nn as nn
    sys.path.insert(0, str(HERE.parent.parent / "examples" / "pytorch"))
    import models

    def many_small():
        layers = []
        for _ in range(args.blocks):
            layers += [nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(64, 10)), (64,)

    def large():
        return models.mlp(hidden=2048), (1, 28, 28)

    table = {"many_small": (many_small, args.batch_small), "large": (large, args.batch_large)}
    unknown = [m for m in args.models if m not in table]
    if unknown:
        raise SystemExit("unknown model(s) %s (choose from %s)" % (unknown, ", ".join(table)))
    return {name: table[name] for name in args.models}


class Case:
    """One model wrapped by both DDPs, with its optimizers and data."""

    def __init__(self, name, build, batch, rank, perseus_ddp, torch_ddp):
        import torch
        torch.manual_seed(0)
        model, shape = build()
        self.name = name
        self.tensors = sum(1 for _ in model.parameters())
        self.params = sum(p.numel() for p in model.parameters())
        self.models = {"perseus": perseus_ddp(copy.deepcopy(model)),
                       "torch": torch_ddp(copy.deepcopy(model))}
        self.opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
                     for k, m in self.models.items()}
        g = torch.Generator().manual_seed(1 + rank)
        self.data = torch.randn((batch,) + shape, generator=g)
        self.target = torch.randint(0, 10, (batch,), generator=g)

    def step(self, backend):
        import torch.nn.functional as F
        model, opt = self.models[backend], self.opts[backend]
        opt.zero_grad()
        F.cross_entropy(model(self.data), self.target).backward()
        opt.step()

    def max_difference(self):
        ours = self.models["perseus"].module.parameters()
        theirs = self.models["torch"].module.parameters()
        return max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(ours, theirs))


def run(args):
    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    import perseus.torch.distributed as dist
    from perseus.torch.nn.parallel import DistributedDataParallel as PerseusDDP

    torch.set_num_threads(args.threads)
    rank, size = launcher_rank_size()
    dist.init_process_group()
    if "MASTER_PORT" not in os.environ:  # rank 0 picks gloo's rendezvous port
        port = [free_port() if rank == 0 else None]
        dist.broadcast_object_list(port, src=0)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port[0]))
    tdist.init_process_group("gloo", rank=rank, world_size=size)
    barriers = {"perseus": dist.barrier, "torch": tdist.barrier}
    cases = [Case(name, build, batch, rank, PerseusDDP, TorchDDP)
             for name, (build, batch) in build_models(args).items()]

    def block(case, backend, iters):
        barriers[backend]()
        start = time.perf_counter()
        for _ in range(iters):
            case.step(backend)
        return (time.perf_counter() - start) / iters

    for case in cases:  # warm-up: allocations, caches, name negotiation
        for backend in ("perseus", "torch"):
            block(case, backend, args.warmup)
    samples = {(c.name, b): [] for c in cases for b in ("perseus", "torch")}
    for r in range(args.repeat):
        order = ("perseus", "torch") if r % 2 == 0 else ("torch", "perseus")
        for case in cases:
            times = torch.tensor([block(case, backend, args.iters) for backend in order],
                                 dtype=torch.float64)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # outside the timed blocks
            for backend, t in zip(order, times.tolist()):
                samples[(case.name, backend)].append(t)

    for case in cases:
        worst = case.max_difference()
        if worst > 1e-3:
            raise SystemExit("rank %d: %s: the Perseus and torch copies differ by %.3g after "
                             "training on the same data" % (rank, case.name, worst))
    if rank == 0:
        report(args, cases, samples, size)
    tdist.destroy_process_group()
    dist.destroy_process_group()


def report(args, cases, samples, size):
    print("np=%d, %d torch thread(s) per rank, %d rounds of %d steps (after %d warm-up), "
          "medians\n" % (size, args.threads, args.repeat, args.iters, args.warmup))
    print("| model | tensors | parameters | batch/rank | torch DDP (gloo) ms/step | "
          "Perseus DDP ms/step | Perseus / torch | goal |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    goals = {"many_small": 0.8, "large": 1.0}
    result = {}
    for case in cases:
        ours, theirs = samples[(case.name, "perseus")], samples[(case.name, "torch")]
        ratio = statistics.median(a / b for a, b in zip(ours, theirs))
        goal = goals.get(case.name)
        verdict = "n/a" if goal is None else ("PASS" if ratio <= goal else "MISS")
        batch = args.batch_small if case.name == "many_small" else args.batch_large
        print("| %s | %d | %d | %d | %.2f | %.2f | %.3f | <= %.1f: %s |" % (
            case.name, case.tensors, case.params, batch, 1e3 * statistics.median(theirs),
            1e3 * statistics.median(ours), ratio, goal or 0, verdict))
        result[case.name] = {"perseus_s": ours, "torch_s": theirs, "ratio": ratio,
                             "goal": goal, "verdict": verdict}
    if args.json:
        Path(args.json).write_text(json.dumps({"np": size, "args": vars(args), "cases": result},
                                              indent=1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=30, help="timed steps per block")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per backend and model")
    p.add_argument("--repeat", type=int, default=5, help="rounds (backend order alternates)")
    p.add_argument("--models", nargs="+", default=["many_small", "large"])
    p.add_argument("--blocks", type=int, default=40, help="Linear+BatchNorm blocks of many_small")
    p.add_argument("--batch-small", type=int, default=16, help="per rank, many_small")
    p.add_argument("--batch-large", type=int, default=32, help="per rank, large")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--json", help="write every sample here")
    run(p.parse_args())


if __name__ == "__main__":
    main()
