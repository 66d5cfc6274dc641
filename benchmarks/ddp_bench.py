"""Training step time of torch's DistributedDataParallel over gloo, of the same torch
DDP over the "perseus" backend, and of Perseus's drop-in DDP, on the same CPU models,
in one run; and of torch's DDP over bare mpi4py calls (the floor of any process group
written in Python, see below).

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/ddp_bench.py [--repeat 5] [--iters 30] [--json PATH]

The default group is torch.distributed's "perseus" (init_process_group("perseus")),
gloo's a group of every rank (new_group(backend="gloo"), over the same store). The
three DDPs live in the same processes (one torch thread per rank), wrap copies of the
same model, and train on the same data with SGD. A round times one block of --iters
steps per DDP and model; the order of the DDPs rotates from round to round, so
drift on this shared machine hits all alike. Before a block each DDP's own group
runs a barrier; a block's step time is its wall time / iters, the maximum over the
ranks (a step is done when every rank is). The table gives the medians over rounds
and the medians of the per-round ratios to gloo (and of torch-over-perseus to the
drop-in).

Models:
  many_small  40 blocks of Linear(64, 64) + BatchNorm1d(64): 160 parameter tensors
              (about 0.17 M parameters) and 120 buffers, little compute per step,
              so communication latency and per-tensor overhead dominate;
  large       models.mlp(hidden=2048): three tensors of up to 16 MiB (5.8 M
              parameters), so bandwidth dominates.

The floor: a process group whose allreduce and broadcast are one blocking mpi4py
call each on the tensor's memory, with no names, checks, timeouts or errors (it is
correct only for what torch's DDP asks of it here). Torch's DDP over it spends what
its own reducer and buffer broadcast cost around a raw MPI collective: no backend of
torch's DDP, Python or C++, does less per call, so it bounds what "perseus" can gain.

Goals (issues 4 and 38): Perseus <= 0.8x gloo's step time on many_small, and no
worse on large. After timing, the three copies of each model must still agree
(they trained on the same data), or the run stops: a fast wrong answer is not a
result.
"""
import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


# Row keys, in table order, and their titles.
DDPS = {"gloo": "torch DDP over gloo", "perseus": "torch DDP over perseus",
        "dropin": "Perseus's drop-in DDP", "floor": "torch DDP over bare mpi4py (the floor)"}


def bare_mpi_group():
    """A torch ProcessGroup whose allreduce (SUM) and broadcast are one blocking mpi4py
    call on the tensor's memory (contiguous CPU tensors): the floor described above."""
    import torch
    import torch.distributed as tdist
    from mpi4py import MPI

    comm = MPI.COMM_WORLD

    class Done(tdist.Work):
        def __init__(self, tensors):
            super().__init__()
            self._tensors = tensors

        def wait(self, timeout=None):
            return True

        def get_future(self):
            future = torch.futures.Future()
            future.set_result(self._tensors)
            return future

    class BareMpi(tdist.ProcessGroup):
        def getBackendName(self):
            return "bare-mpi4py"

        def allreduce(self, tensors, opts=None):
            comm.Allreduce(MPI.IN_PLACE, tensors[0].numpy())
            return Done(tensors)

        def broadcast(self, tensors, opts):
            comm.Bcast(tensors[0].numpy(), opts.rootRank)
            return Done(tensors)

        def allgather(self, output_lists, inputs, opts=None):  # DDP's check of shapes at start
            gathered = torch.empty((comm.size,) + tuple(inputs[0].shape), dtype=inputs[0].dtype)
            comm.Allgather(inputs[0].numpy(), gathered.numpy())
            for out, row in zip(output_lists[0], gathered):
                out.copy_(row)
            return Done(output_lists)

        def barrier(self, opts=None):
            comm.Barrier()
            return Done([])

    # Registered as a backend of its own, so that torch's group binds it to the CPU.
    tdist.Backend.register_backend("bare_mpi4py", lambda store, rank, size, timeout: BareMpi(
        rank, size), devices=["cpu"])
    return tdist.new_group(backend="bare_mpi4py")


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
    """One model wrapped by every DDP (wrap: key -> function of a module), with its
    optimizers and data."""

    def __init__(self, name, build, batch, rank, wrap):
        import torch
        torch.manual_seed(0)
        model, shape = build()
        self.name = name
        self.tensors = sum(1 for _ in model.parameters())
        self.params = sum(p.numel() for p in model.parameters())
        self.models = {k: w(copy.deepcopy(model)) for k, w in wrap.items()}
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

    def max_difference(self, key):
        ours = self.models[key].module.parameters()
        theirs = self.models["gloo"].module.parameters()
        return max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(ours, theirs))


def run(args):
    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    import perseus.torch.distributed as dist
    from perseus.torch.nn.parallel import DistributedDataParallel as PerseusDDP

    torch.set_num_threads(args.threads)
    tdist.init_process_group("perseus")  # ranks from mpirun
    rank, size = tdist.get_rank(), tdist.get_world_size()
    gloo = tdist.new_group(backend="gloo")
    floor = bare_mpi_group()
    wrap = {"gloo": lambda m: TorchDDP(m, process_group=gloo), "perseus": TorchDDP,
            "dropin": PerseusDDP, "floor": lambda m: TorchDDP(m, process_group=floor)}
    barriers = {"gloo": lambda: tdist.barrier(group=gloo), "perseus": tdist.barrier,
                "dropin": dist.barrier, "floor": lambda: tdist.barrier(group=floor)}
    cases = [Case(name, build, batch, rank, wrap)
             for name, (build, batch) in build_models(args).items()]

    def block(case, key, iters):
        barriers[key]()
        start = time.perf_counter()
        for _ in range(iters):
            case.step(key)
        return (time.perf_counter() - start) / iters

    keys = list(DDPS)
    for case in cases:  # warm-up: allocations, caches, name negotiation
        for key in keys:
            block(case, key, args.warmup)
    samples = {(c.name, k): [] for c in cases for k in keys}
    for r in range(args.repeat):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        for case in cases:
            times = torch.tensor([block(case, key, args.iters) for key in order],
                                 dtype=torch.float64)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # outside the timed blocks
            for key, t in zip(order, times.tolist()):
                samples[(case.name, key)].append(t)

    for case in cases:
        for key in ("perseus", "dropin", "floor"):
            worst = case.max_difference(key)
            if worst > 1e-3:
                raise SystemExit("rank %d: %s: %s and %s differ by %.3g after training on the "
                                 "same data" % (rank, case.name, DDPS[key], DDPS["gloo"], worst))
    if rank == 0:
        report(args, cases, samples, size)
    tdist.destroy_process_group()


def ratio(samples, case, ours, theirs):
    """The median over rounds of ours / theirs."""
    return statistics.median(a / b for a, b in zip(samples[(case, ours)], samples[(case, theirs)]))


def report(args, cases, samples, size):
    print("np=%d, %d torch thread(s) per rank, %d rounds of %d steps (after %d warm-up), "
          "medians\n" % (size, args.threads, args.repeat, args.iters, args.warmup))
    print("| model | tensors | parameters | batch/rank | DDP | ms/step | / gloo | goal |")
    print("|---|---:|---:|---:|---|---:|---:|---|")
    goals = {"many_small": 0.8, "large": 1.0}
    result = {}
    for case in cases:
        batch = args.batch_small if case.name == "many_small" else args.batch_large
        goal = goals.get(case.name)
        entry = result[case.name] = {"goal": goal}
        for key, title in DDPS.items():
            times = samples[(case.name, key)]
            entry[key + "_s"] = times
            if key == "gloo":
                cells, verdict = "1", ""
            else:
                r = entry[key + "_ratio"] = ratio(samples, case.name, key, "gloo")
                cells = "%.3f" % r
                verdict = "n/a" if goal is None or key == "floor" else "<= %.1f: %s" % (
                    goal, "PASS" if r <= goal else "MISS")
            print("| %s | %d | %d | %d | %s | %.2f | %s | %s |" % (
                case.name, case.tensors, case.params, batch, title,
                1e3 * statistics.median(times), cells, verdict))
        entry["perseus_to_dropin"] = ratio(samples, case.name, "perseus", "dropin")
        entry["perseus_to_floor"] = ratio(samples, case.name, "perseus", "floor")
    print()
    for case in cases:
        print("%s: torch DDP over perseus / Perseus's drop-in DDP: %.3f, / the floor: %.3f "
              "(medians of rounds)" % (case.name, result[case.name]["perseus_to_dropin"],
                                      result[case.name]["perseus_to_floor"]))
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
