#!/usr/bin/env python
"""Which MPI scripts/setup.sh should install by default (issue 46): Perseus on the MPICH
core (the default, .venv) against Perseus on the Open MPI 5 core (.venv-ompi5), with
ULFM on (`mpirun --with-ft ulfm`, as `perseusrun --elastic` runs it) and off, all in
one run.

    .venv/bin/python benchmarks/mpi_choice.py [--nps 2 4] [--repeat 3] [--iters 100]

One round runs, for each np, one job per MPI in turn (the order rotates each round, so
that drift of the machine does not favour one), each job measuring in its processes:

  4 KiB, 1 MiB, 16 MiB    in-place hvd.allreduce_ of float32 (a sample: one call)
  resnet50                the ResNet-50 gradient set, 161 allreduce_async_ then
                          synchronize (resnet50_shapes.py)
  step                    a training step of a small MLP (4 layers of 512) with
                          hvd.DistributedOptimizer: forward, backward, step

Each sample is the maximum over the ranks of that iteration's time (a barrier before
it); every result is checked against the sum the ranks' inputs must give. The report
prints the median over rounds of each job's median sample, and per MPI the median over
rounds of its ratio to MPICH's in the same round (the MPICH core is the baseline: the
machine's noise cancels in the ratio). The Open MPI 5 core is built (or found in
~/.cache/perseus) as elastic_recovery.py builds it; .venv-ompi5 comes from
scripts/setup.sh --all.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIZES = {"4 KiB": 1024, "1 MiB": 256 * 1024, "16 MiB": 4 * 1024 * 1024}  # float32 elements
CASES = list(SIZES) + ["resnet50", "step"]
WARMUP = 5


def _timed(hvd, torch, iters, run):
    """`iters` samples of run() (after WARMUP), each the maximum over the ranks."""
    mine = []
    for i in range(WARMUP + iters):
        hvd.barrier()
        start = time.perf_counter()
        run()
        if i >= WARMUP:
            mine.append(time.perf_counter() - start)
    every = hvd.allgather_object(mine)
    return [max(samples) for samples in zip(*every)]


def worker(out_path, iters):
    """One job's measurements (under mpirun); rank 0 writes {case: median seconds}."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import torch
    import perseus.torch.horovod as hvd
    from resnet50_shapes import resnet50_param_shapes
    torch.set_num_threads(1)
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    want = float(size * (size + 1) // 2)  # rank r gives r + 1
    medians = {}
    for case, count in SIZES.items():
        buf = torch.empty(count)

        def allreduce(buf=buf, case=case):
            buf.fill_(rank + 1)
            hvd.allreduce_(buf, op=hvd.Sum, name="mpi_choice." + case)
            assert buf[0].item() == want and buf[-1].item() == want, (case, buf[0].item())
        medians[case] = statistics.median(_timed(hvd, torch, iters, allreduce))
    grads = [torch.empty(shape) for shape in resnet50_param_shapes()]

    def resnet50():
        for g in grads:
            g.fill_(rank + 1)
        handles = [hvd.allreduce_async_(g, op=hvd.Sum, name="mpi_choice.grad.%d" % i)
                   for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)
        assert grads[0].flatten()[0].item() == want and grads[-1][-1].item() == want
    medians["resnet50"] = statistics.median(_timed(hvd, torch, max(10, iters // 10), resnet50))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(512, 512),
                                                                torch.nn.ReLU())])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(rank))

    def step():
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    medians["step"] = statistics.median(_timed(hvd, torch, iters, step))
    first = [p.detach().clone() for p in model.parameters()][0]
    assert all(torch.equal(first, other) for other in hvd.allgather_object(first)), \
        "the ranks' parameters differ"
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(medians, f)
    hvd.shutdown()


def configurations():
    """[(name, mpirun argv prefix, python, PYTHONPATH)]: MPICH first (the baseline)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from elastic_recovery import ulfm_package
    bin_dir, package = ulfm_package()
    ompi = [str(bin_dir / "mpirun"), "--allow-run-as-root", "--oversubscribe", "--mca",
            "plm_rsh_agent", "false"]
    return [("MPICH", [str(REPO / ".venv" / "bin" / "mpirun")],
             str(REPO / ".venv" / "bin" / "python"), str(REPO)),
            ("Open MPI 5, ULFM on", ompi[:1] + ["--with-ft", "ulfm"] + ompi[1:],
             str(bin_dir / "python"), str(package)),
            ("Open MPI 5, ULFM off", ompi, str(bin_dir / "python"), str(package))]


def run_job(config, np, iters):
    name, mpirun, python, pythonpath = config
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "medians.json")
        env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1")
        cmd = mpirun + ["-np", str(np), python, "-P", __file__, "--worker", out,
                        "--iters", str(iters)]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if res.returncode != 0 or not os.path.exists(out):
            sys.exit("mpi_choice: %s at np %d failed (%d):\n%s\n%s" % (
                name, np, res.returncode, res.stdout[-3000:], res.stderr[-3000:]))
        with open(out) as f:
            return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nps", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.iters)
    configs = configurations()
    names = [c[0] for c in configs]
    # rounds[np][name] = [medians of each round]
    rounds = {np: {name: [] for name in names} for np in args.nps}
    for r in range(args.repeat):
        for np in args.nps:
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for config in order:
                rounds[np][config[0]].append(run_job(config, np, args.iters))
                print("round %d np %d %s done" % (r + 1, np, config[0]), flush=True)
    for np in args.nps:
        print("\nnp %d: medians of %d rounds (ms), and the ratio to MPICH (median of the "
              "per-round ratios)" % (np, args.repeat))
        print("| case | " + " | ".join(names) + " | " +
              " | ".join("%s / MPICH" % n for n in names[1:]) + " |")
        print("|---" * (2 * len(names)) + "|")
        for case in CASES:
            cells = ["%.3f" % (1e3 * statistics.median(m[case] for m in rounds[np][n]))
                     for n in names]
            ratios = ["%.2fx" % statistics.median(
                m[case] / base[case] for m, base in zip(rounds[np][n], rounds[np]["MPICH"]))
                for n in names[1:]]
            print("| %s | %s | %s |" % (case, " | ".join(cells), " | ".join(ratios)))


if __name__ == "__main__":
    main()
