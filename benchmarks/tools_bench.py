"""Epoch time of PyTorch Lightning's DDPStrategy and of DeepSpeed's ZeRO stages 0-3,
each over gloo and over the "perseus" backend, on the same CPU model, in one run.

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/tools_bench.py [--repeat 16] [--json PATH]

What torch users train with, where benchmarks/ddp_bench.py times torch's own DDP. A
block is one training run of one tool over one backend: the process group is made
the way the tool makes it (Lightning: DDPStrategy(process_group_backend=...) with its
MPIEnvironment; DeepSpeed: deepspeed.init_distributed(dist_backend=...) then
deepspeed.initialize()), the same seeded model trains on the same data for --warmup
untimed epochs and --epochs timed ones, and the group is destroyed again (so each
block starts from nothing, as a job would). A block's epoch time is the wall time of
its timed epochs / --epochs, the maximum over the ranks; its CPU time (all threads of
the process, the backend's own too, mean over the ranks) and set-up time (process
group, Trainer or engine, up to the first epoch) are reported apart. Within each round
every tool runs over both backends, gloo first in even rounds and perseus first in
odd ones, so drift on this shared machine hits both alike. The table gives the
medians over rounds, the medians of the per-round ratios perseus / gloo (wall and
CPU), and in how many rounds perseus was the faster.

After each block every rank's final weights must be bitwise equal to every other
rank's, and perseus's equal (to --tolerance, default 0: bitwise) to gloo's of the same
tool, or the run stops: a fast wrong answer is not a result.

The model: --layers Linear(--width, --width) + ReLU, then Linear(--width, 10) (default
21 x 64: 44 parameter tensors, 0.09 M parameters, little compute per step, so
per-collective latency and per-tensor overhead dominate), SGD with momentum, batch
--batch per rank, --steps steps per epoch (--zero3-steps for ZeRO-3, whose steps are
about 7x slower); the ranks train on disjoint halves of one data set (under DeepSpeed
rank r takes samples r, r + np, ...; Lightning's DistributedSampler shuffles them, in
the same order over both backends). DeepSpeed keeps its defaults, gradient clipping
to norm 1.0 included (one more all-reduce a step). One torch thread per rank. Goal
(issue 48): perseus at least as fast as gloo (ratio <= 1.0) for each tool.

DeepSpeed runs with its CPU accelerator (DS_ACCELERATOR=cpu, set here) and without its
shared-memory op (deepspeed.comm.torch.build_shm_op), which only serves inference's
all_reduce and takes a minute to compile on first use. Tools not installed are left
out, with a line that says so; --tools picks (lightning, zero0, zero1, zero2, zero3).
"""
import argparse
import hashlib
import json
import logging
import os
import socket
import statistics
import sys
import time
import warnings
from pathlib import Path

TOOLS = {"lightning": "Lightning DDPStrategy", "zero0": "DeepSpeed ZeRO-0",
         "zero1": "DeepSpeed ZeRO-1", "zero2": "DeepSpeed ZeRO-2", "zero3": "DeepSpeed ZeRO-3"}
BACKENDS = ("gloo", "perseus")


def build_model(args):
    import torch.nn as nn
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(args.width, 10))


def steps(args, tool):
    return args.zero3_steps if tool == "zero3" else args.steps


def dataset(args, tool, size):
    """One data set of steps x batch x size samples; rank r trains on r, r + size, ..."""
    import torch
    g = torch.Generator().manual_seed(1)
    n = steps(args, tool) * args.batch * size
    return torch.randn(n, args.width, generator=g), torch.randint(0, 10, (n,), generator=g)


def flat_weights(parameters):
    import torch
    return torch.cat([p.detach().reshape(-1).clone() for p in parameters])


# ---- Lightning ---------------------------------------------------------------------

def lightning_modules():
    """(Lightning, its MPIEnvironment): the `lightning` package's, else `pytorch_lightning`'s."""
    try:
        import lightning.pytorch as pl
        from lightning.pytorch.plugins.environments import MPIEnvironment
    except ImportError:
        import pytorch_lightning as pl
        from pytorch_lightning.plugins.environments import MPIEnvironment
    # Quiet (set after the import, which sets INFO): its tips, "Trainer.fit stopped", ...
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return pl, MPIEnvironment


def now():
    """(wall, CPU) seconds: this process's CPU time, all its threads (the engine's too)."""
    return time.perf_counter(), time.process_time()


def lightning_block(args, backend, comm, clock):
    """One Lightning fit over `backend` -> finish()'s tuple."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset
    pl, MPIEnvironment = lightning_modules()

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = build_model(args)

        def training_step(self, batch, _):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    class Clock(pl.Callback):
        def on_train_epoch_start(self, trainer, module):
            clock.append(now())

        def on_train_epoch_end(self, trainer, module):
            clock.append(now())

    start = now()
    x, y = dataset(args, "lightning", comm.Get_size())
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch, shuffle=False)
    strategy = pl.strategies.DDPStrategy(
        process_group_backend=backend,
        cluster_environment=MPIEnvironment())
    trainer = pl.Trainer(accelerator="cpu", devices=comm.Get_size(), num_nodes=1,
                         strategy=strategy, max_epochs=args.warmup + args.epochs,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=10 ** 6,
                         callbacks=[Clock()])
    module = Module()
    trainer.fit(module, loader)
    return finish(args, start, clock, flat_weights(module.net.parameters()))


def finish(args, start, clock, weights):
    """(set-up s, epoch s, CPU s per epoch, weights) from the block's start and its
    epochs' start and end times (now()): set-up is the wall time up to the first epoch
    (warm-up or timed)."""
    assert len(clock) == 2 * (args.warmup + args.epochs), clock
    first, last = clock[2 * args.warmup], clock[-1]
    return (clock[0][0] - start[0], (last[0] - first[0]) / args.epochs,
            (last[1] - first[1]) / args.epochs, weights)


# ---- DeepSpeed ---------------------------------------------------------------------

def deepspeed_block(args, backend, stage, comm, clock):
    """One DeepSpeed ZeRO-`stage` training over `backend` -> finish()'s tuple."""
    import torch
    import torch.nn.functional as F
    import deepspeed
    import deepspeed.comm

    rank, size = comm.Get_rank(), comm.Get_size()
    start = now()
    deepspeed.init_distributed(dist_backend=backend, verbose=False)
    torch.manual_seed(0)
    model = build_model(args)
    config = {"train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9}},
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10 ** 9}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    x, y = dataset(args, "zero%d" % stage, size)
    batches = [(x[i:i + args.batch * size][rank::size], y[i:i + args.batch * size][rank::size])
               for i in range(0, len(x), args.batch * size)]
    for _ in range(args.warmup + args.epochs):
        clock.append(now())
        for xb, yb in batches:
            engine.backward(F.cross_entropy(engine(xb), yb))
            engine.step()
        clock.append(now())
    parameters = list(engine.module.parameters())
    if stage == 3:  # partitioned: gather the whole of each parameter first
        with deepspeed.zero.GatheredParameters(parameters):
            weights = flat_weights(parameters)
    else:
        weights = flat_weights(parameters)
    deepspeed.comm.destroy_process_group()
    return finish(args, start, clock, weights)


def prepare_deepspeed():
    """DeepSpeed on the CPU, quiet, without its shared-memory op (see the docstring)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import importlib
    import deepspeed
    # (deepspeed.comm.torch, as an attribute, is torch itself: deepspeed.comm imports it)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.utils.logger.setLevel(logging.ERROR)  # and its advice on ZeRO with SGD


# ---- the run -----------------------------------------------------------------------

def available_tools(args):
    import importlib.util
    found, missing = [], []
    for tool in (t for t in TOOLS if t in args.tools):
        package = "deepspeed" if tool.startswith("zero") else "lightning"
        ok = (importlib.util.find_spec("deepspeed") is not None if package == "deepspeed" else
              any(importlib.util.find_spec(m) is not None for m in ("lightning", "pytorch_lightning")))
        (found if ok else missing).append(tool)
    return found, missing


def gloo_env(comm):
    """The rendezvous gloo's init_process_group reads (env://): rank 0's free port.
    Lightning's MPIEnvironment sets its own; perseus needs none."""
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(comm.Get_rank()), WORLD_SIZE=str(comm.Get_size()),
                      LOCAL_RANK=str(comm.Get_rank()))


def run(args):
    import torch
    from mpi4py import MPI
    import perseus.torch  # noqa: F401  registers the "perseus" backend

    warnings.filterwarnings("ignore")  # Lightning's advice about workers and log intervals
    torch.set_num_threads(args.threads)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    tools, missing = available_tools(args)
    if any(t.startswith("zero") for t in tools):
        prepare_deepspeed()

    def block(tool, backend):
        clock = []
        if tool == "lightning":
            return lightning_block(args, backend, comm, clock)
        gloo_env(comm)
        return deepspeed_block(args, backend, int(tool[-1]), comm, clock)

    # (tool, backend) -> per round: epoch s (max over ranks), CPU s per epoch (mean
    # over ranks), set-up s (max over ranks)
    samples = {(t, b): {"epoch_s": [], "cpu_s": [], "setup_s": []} for t in tools for b in BACKENDS}
    worst = {t: 0.0 for t in tools}
    for r in range(args.repeat):
        order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
        for tool in tools:
            weights = {}
            for backend in order:
                comm.Barrier()
                setup, epoch, cpu, weights[backend] = block(tool, backend)
                entry = samples[(tool, backend)]
                entry["setup_s"].append(comm.allreduce(setup, op=MPI.MAX))
                entry["epoch_s"].append(comm.allreduce(epoch, op=MPI.MAX))
                entry["cpu_s"].append(comm.allreduce(cpu, op=MPI.SUM) / size)
                digest = hashlib.sha256(weights[backend].numpy().tobytes()).hexdigest()
                digests = comm.allgather(digest)
                if len(set(digests)) != 1:
                    raise SystemExit("%s over %s: the ranks' weights differ after training "
                                     "(sha256 %s)" % (TOOLS[tool], backend, digests))
            diff = float((weights["perseus"] - weights["gloo"]).abs().max())
            worst[tool] = max(worst[tool], diff)
            if diff > args.tolerance:
                raise SystemExit("%s: perseus's weights and gloo's differ by %.3g after the "
                                 "same training" % (TOOLS[tool], diff))
        if rank == 0 and args.verbose:
            print("round %d (%s first): %s" % (r, order[0], ", ".join(
                "%s/%s %.3f" % (t, b, samples[(t, b)]["epoch_s"][-1])
                for t in tools for b in BACKENDS)), flush=True)
    if rank == 0:
        report(args, tools, missing, samples, worst, size)


def ratio(samples, tool, key="epoch_s"):
    """The median over rounds of perseus / gloo."""
    return statistics.median(p / g for p, g in zip(samples[(tool, "perseus")][key],
                                                    samples[(tool, "gloo")][key]))


def report(args, tools, missing, samples, worst, size):
    params = sum(p.numel() for p in build_model(args).parameters())
    print("np=%d, %d torch thread(s) per rank; model %d x Linear(%d, %d) + Linear(%d, 10): "
          "%d tensors, %d parameters; batch %d per rank; %d steps per epoch (ZeRO-3: %d); "
          "%d rounds of %d timed epochs (after %d warm-up); medians\n"
          % (size, args.threads, args.layers, args.width, args.width, args.width,
             2 * (args.layers + 1), params, args.batch, args.steps, args.zero3_steps,
             args.repeat, args.epochs, args.warmup))
    if missing:
        print("left out (not installed): %s\n" % ", ".join(TOOLS[t] for t in missing))
    print("| tool | backend | ms/step | CPU ms/step | set-up s | / gloo | CPU / gloo | rounds "
          "faster | goal | perseus - gloo weights |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    result = {}
    for tool in tools:
        per_step = 1e3 / steps(args, tool)
        entry = result[tool] = {"steps_per_epoch": steps(args, tool),
                                "max_weight_difference": worst[tool]}
        for backend in BACKENDS:
            sample = samples[(tool, backend)]
            entry[backend] = sample
            if backend == "gloo":
                cells, verdict, same = ("1", "1", ""), "", ""
            else:
                r = entry["ratio"] = ratio(samples, tool)
                c = entry["cpu_ratio"] = ratio(samples, tool, "cpu_s")
                faster = entry["rounds_faster"] = sum(
                    p < g for p, g in zip(sample["epoch_s"], samples[(tool, "gloo")]["epoch_s"]))
                cells = ("%.3f" % r, "%.3f" % c, "%d/%d" % (faster, len(sample["epoch_s"])))
                verdict = "<= 1.0: %s" % ("PASS" if r <= 1.0 else "MISS")
                same = "identical" if worst[tool] == 0 else "max %.3g" % worst[tool]
            print("| %s | %s | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s |" % (
                TOOLS[tool], backend, per_step * statistics.median(sample["epoch_s"]),
                per_step * statistics.median(sample["cpu_s"]),
                statistics.median(sample["setup_s"]), cells[0], cells[1], cells[2], verdict, same))
    if args.json:
        Path(args.json).write_text(json.dumps({"np": size, "args": vars(args), "tools": result},
                                              indent=1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tools", nargs="+", default=list(TOOLS), choices=list(TOOLS))
    p.add_argument("--repeat", type=int, default=8, help="rounds (backend order alternates)")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per block")
    p.add_argument("--warmup", type=int, default=1, help="untimed epochs per block, first")
    p.add_argument("--steps", type=int, default=48, help="steps per epoch")
    p.add_argument("--zero3-steps", type=int, default=12,
                   help="steps per epoch of ZeRO-3 (about 8x slower per step)")
    p.add_argument("--batch", type=int, default=16, help="samples per step and rank")
    p.add_argument("--layers", type=int, default=21, help="Linear(width, width) layers")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--tolerance", type=float, default=0.0,
                   help="largest difference allowed between perseus's and gloo's weights")
    p.add_argument("--verbose", action="store_true", help="a line per round")
    p.add_argument("--json", help="write every sample here")
    run(p.parse_args())


if __name__ == "__main__":
    main()
