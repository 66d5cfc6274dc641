#!/usr/bin/env python
"""The plan of scripts/gpu_check.sh's device call (issue 47): what each of its steps costs
on the lent H200, where each figure comes from, and the order and concurrency that follow.

  show [OPTIONS] [--json FILE]  the plan with its predicted times (and as JSON, for `measured`)
  shell [OPTIONS] [--json FILE] the same as shell assignments, for gpu_check.sh (DEVICE_PLAN: the text)
  measured LOGS                 LOGS/measured.json: every step's, job's and script's measured
                                seconds beside its prediction (LOGS/plan.json, *.result and the
                                BATCH TIME lines of job_*.log); prints them as a Markdown table
OPTIONS: --configs "A B" (default: every configuration of tests/gpu/test_gpu.py), --gpus N (1),
--multi-rank 0|1 (1: the NCCL runs several ranks on one GPU), --nccl-check 0|1 (1), --bench 0|1|np2|all
(1: gpu_bench.py at np=1; np2: its --shared-np2 mode only; all: both),
--elastic 0|1 (0), --stress-steps N (1000).

The model, small on purpose (docs/gpu.md, "The plan"):
- A cost has a host part (process start, imports, Python, MPI, and a job's ranks waiting for
  each other's turn on the GPU), which overlaps with other jobs, and a GPU part, in which the
  job holds the one GPU: the GPU time-slices between processes, so the GPU parts of jobs that
  run at once add up.
- The fixed steps (set-up, build, the one-MPI check, benchmark) run one after another.
- The test jobs and --check-build run in one pool: --check-build and the stress runs first,
  the rest longest first, whenever their ranks fit under
  RANK_CAP. The pool takes the longest of three bounds: its longest job alone, the sum of
  its GPU parts, and its rank-seconds over RANK_CAP. Each job's predicted time is its time
  alone, stretched by one factor for the whole pool when a bound other than the schedule binds.
- A configuration whose job would take longer than PART_TARGET_S alone is split into parts,
  each one MPI job of some of its scripts, run at once (the 27 Nov run: six shared-GPU
  configurations at once ran their scripts as fast as two did).
"""
import argparse
import ast
import json
import math
import os
import re
import shlex
import sys
from collections import namedtuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET_S = 360        # issue 47: the whole call, set-up included, in 6 minutes on the H200
CALL_BUDGET_S = 540   # gpu_check.sh's own default (PERSEUS_GPU_CHECK_BUDGET_S): one 600 s call
RANK_CAP = 26         # ranks at once: the 27 Nov run had 25 (twelve configurations) and the pytest
PART_TARGET_S = 150   # longest a test job may take alone before its configuration is split

Cost = namedtuple("Cost", "host gpu source")

# Steps outside the pool, in seconds on the H200 alone.
STEPS = {
    "setup": Cost(20, 0, "estimate: the venv, pip install from wheels/, NCCL unpacked; never timed alone"),
    "build": Cost(20, 0, "estimate: 52-82 s measured with one compiler process (H100 25 Nov, H200 26 Nov); "
                         "the parallel compile (1f22f5e) runs one per core. On the CI machine (30 Nov, no "
                         "ccache) the 77 compiles took 62.7 s one at a time (63.5 s with link and setuptools), "
                         "the longest 4.1 s (engine.cc): with 16 at once, about 4 s + 62.7/16 s, here or at "
                         "the H200's speed (82 s one at a time there), plus pip's start"),
    "nccl_multi_rank": Cost(25, 5, "estimate: NCCL alone, 2 ranks, spawned processes importing torch; never "
                                   "passed on a device (27 Nov: a bug, since fixed); runs during the build"),
    "same_mpi": Cost(5, 0, "estimate: one Python start loading libperseus and mpi4py"),
    "check_build": Cost(10, 0, "estimate: perseusrun --check-build loads torch, CUDA and NCCL once; a job "
                               "of the test pool (host work beside the tests)"),
    "gpu_elastic": Cost(50, 10, "estimate: its core's build as the build's (setup.py, one compile per core), "
                                "20-40 s for the job (NCCL's communicators made twice); only with "
                                "PERSEUS_OMPI5_MPICXX"),
    "gpu_bench_np2": Cost(55, 55, "estimate: benchmarks/gpu_bench.py --shared-np2 (issue 47, point 3), never run "
                                  "on a device: two ranks on GPU 0, torch and ResNet-50 on each, six variants "
                                  "of the training step and three reductions; its step limit is 160 s. "
                                  "Opt-in (PERSEUS_GPU_CHECK_BENCH=np2 or all), for a second call"),
    "gpu_bench": Cost(30, 30, "estimate: never timed alone; its step limit is 150 s; runs alone, as its "
                              "timings need the GPU to itself"),
}
# The in-process tests (pytest, one process): a job of the pool.
INPROC = Cost(15, 5, "estimate: pytest start, torch import, 12 tests on small tensors")
# A configuration this machine has too few GPUs for: pytest starts and skips its tests.
SKIPS = Cost(5, 0, "estimate: pytest start and collection")
# Once per test job: mpirun, Python, the torch import and a CUDA context on each rank.
JOB_START = Cost(5, 1, "estimate: 1.2-2.2 s for an np 2 job on the CI machine (29 Nov, its time less its "
                       "scripts' BATCH TIME), the H200's host runs Python 1.5-2x slower (benchmarks/README.md), "
                       "and a CUDA context per rank")
# Per script, by the kind of configuration, besides HOST_SCALE x the script's CPU seconds.
# Derived from the pre-batch runs, where each script paid a job start (JOB_START) of its own.
SCRIPT = {
    "np1": Cost(0.2, 0.2, "derived: 4-7 s a script before batching (26 Nov, four configurations at once: "
                          "mpi_np2_shared's 14 scripts in the 60-100 s that the 213-225 s run left beside build, "
                          "set-up, in-process tests and benchmark), less a job start (6 s) and HOST_SCALE x CPU "
                          "seconds (1.6 s on average): next to nothing is left"),
    "staged": Cost(0.2, 0.2, "as np1 (host-staged, or NCCL across two GPUs: no ranks sharing a GPU)"),
    "shared2": Cost(13.5, 3, "derived: 24-28 s a script before batching (27 Nov: 10 scripts within the 240 s "
                             "limit with twelve configurations at once; about 28 s with two at once), less a job "
                             "start (6 s) and HOST_SCALE x CPU seconds (1.6 s on average); GPU part: that run's "
                             "~70 scripts in 240 s bound it at 3.4 s on average"),
    "shared4": Cost(19.5, 3, "derived: at most 30 s a script before batching (27 Nov: 8 scripts within the "
                             "240 s limit, twelve configurations at once), less as for shared2; GPU part as "
                             "shared2"),
}
HOST_SCALE = 0.5  # of a script's CPU-run seconds: the device does the arithmetic the CPU run does on the host
# Each script's seconds at np 2 on the 2-core CI machine, CPU tensors (PTEST_DEVICE / PTEST_GPU=cpu), in one
# batch job: measured 29 Nov from BATCH TIME lines. test_gpu_scripts_run_on_the_cpu checks the torch
# scripts' shares against its own job in every CI run.
CPU_SECONDS = {
    "allreduce": 3.9, "grouped_allreduce": 5.8, "allgather": 0.4, "broadcast": 0.3, "alltoall": 0.4,
    "reducescatter": 0.6, "join": 0.1, "barrier": 1.9, "process_sets": 0.1,
    "gpu_torch_collectives": 22.1, "gpu_torch_ordering": 0.5, "gpu_torch_sizes": 2.3,
    "gpu_torch_training": 7.0, "gpu_torch_backend": 0.6,
    "gpu_torch_mismatch": 0.5,  # estimate: it needs two device kinds, so it has no CPU run
}
UNKNOWN_CPU_S = 5.0  # a script without a figure still gets planned on the device; CI fails on it
# gpu_stress.py's 1,000 steps with 4 lanes, by ranks: measured 27 Nov on the H200, the np 2 and np 4
# runs at once (45.8 s and 73.2 s), taken as their times alone; the GPU part is an estimate (a quarter).
# Not measured with 1 or 2 lanes: the 4-lane figures stand in.
STRESS = {2: Cost(34.3, 11.5, "measured: 45.8 s at np 2, 4 lanes (H200 27 Nov, with np 4 at once)"),
          4: Cost(55.0, 18.2, "measured: 73.2 s at np 4, 4 lanes (H200 27 Nov, with np 2 at once)")}


def load_test_configs():
    """CONFIGS and config_scripts of tests/gpu/test_gpu.py, read without importing it (that needs a
    real torch): its constant assignments and that function, run on their own."""
    names = {"REUSED", "GPU_ONLY", "NEEDS_TWO_RANKS", "NO_DEVICE_TENSORS", "LANE_SCRIPTS", "CONFIGS"}
    with open(os.path.join(REPO, "tests", "gpu", "test_gpu.py")) as f:
        tree = ast.parse(f.read())
    keep = [node for node in tree.body
            if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets][0] in names)
            or (isinstance(node, ast.FunctionDef) and node.name == "config_scripts")]
    space = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "tests/gpu/test_gpu.py", "exec"), space)
    return space["CONFIGS"], space["config_scripts"]


def shared_nccl(config):
    return config.startswith("nccl_") and "_shared_" in config  # as tests/gpu/test_gpu.py decides


def kind(config, ranks):
    if shared_nccl(config):
        return "shared%d" % ranks
    return "np1" if ranks == 1 else "staged"


def script_cost(config, ranks, script):
    base = SCRIPT[kind(config, ranks)]
    return base.host + HOST_SCALE * CPU_SECONDS.get(script, UNKNOWN_CPU_S), base.gpu


def job(name, ranks, host, gpu, **extra):
    return dict(extra, name=name, ranks=ranks, host=round(host, 1), gpu=round(gpu, 1), alone=round(host + gpu, 1))


def split(scripts, cost, parts):
    """Scripts into `parts` groups of near-equal cost (longest first into the lightest group),
    each group in the configuration's own order."""
    groups = [[] for _ in range(parts)]
    for script in sorted(scripts, key=lambda s: -sum(cost(s))):
        min(groups, key=lambda g: sum(sum(cost(s)) for s in g)).append(script)
    return [[s for s in scripts if s in g] for g in groups if g]


def config_jobs(config, ranks, scripts):
    """The test job(s) of a configuration: one, or parts when one would be longer than PART_TARGET_S."""
    cost = lambda s: script_cost(config, ranks, s)  # noqa: E731
    total = sum(sum(cost(s)) for s in scripts) + sum(JOB_START[:2])
    parts = max(1, math.ceil(total / PART_TARGET_S))
    groups = split(scripts, cost, parts) if parts > 1 else [scripts]
    jobs = []
    for i, group in enumerate(groups, 1):
        name = "test_%s" % config + (".part%d" % i if len(groups) > 1 else "")
        jobs.append(job(name, ranks, JOB_START.host + sum(cost(s)[0] for s in group),
                        JOB_START.gpu + sum(cost(s)[1] for s in group), config=config, scripts=group))
    return jobs


def starts_first(name):
    """--check-build (what the report reads first) and the stress runs (what a run cut short
    most needs) start before the rest."""
    return name == "check_build" or name.startswith("stress_")


def pool(jobs):
    """Starts starts_first's jobs first, then the rest longest first, each whenever its ranks
    fit under RANK_CAP -> (wall, jobs with predicted start and end, the bound that binds)."""
    jobs = sorted(jobs, key=lambda j: (not starts_first(j["name"]), -j["alone"]))
    running, clock = [], 0.0  # running: (end, ranks)
    for j in jobs:
        while running and sum(r for _, r in running) + j["ranks"] > RANK_CAP:
            clock = max(clock, min(running)[0])
            running.remove(min(running))
        j["start"], j["end"] = clock, clock + j["alone"]
        running.append((j["end"], j["ranks"]))
    schedule = max([j["end"] for j in jobs] or [0])
    bounds = {"schedule": schedule, "gpu": sum(j["gpu"] for j in jobs),
              "ranks": sum(j["ranks"] * j["alone"] for j in jobs) / RANK_CAP}
    binding = max(bounds, key=bounds.get)
    stretch = bounds[binding] / schedule if schedule else 1.0
    for j in jobs:  # one factor for all: the GPU (or the cores) slow every job alike
        j["start"], j["end"] = round(j["start"] * stretch, 1), round(j["end"] * stretch, 1)
        j["predicted"] = round(j["end"] - j["start"], 1)
    return round(bounds[binding], 1), jobs, binding


def make_plan(configs=None, gpus=1, multi_rank=True, nccl_check=True, bench=True, elastic=False,
              stress_steps=1000):
    all_configs, config_scripts = load_test_configs()
    configs = list(all_configs) if configs is None else configs
    steps = [("setup", STEPS["setup"])]
    # The NCCL check needs no Perseus: it runs while the build compiles, and the two at once
    # take the longer (the pool's rule below: neither is bound by the GPU).
    both = [sum(STEPS[name][:2]) for name in ("build", "nccl_multi_rank")]
    steps.append(("build", STEPS["build"]) if not nccl_check else
                 ("build+nccl_multi_rank", Cost(max(both + [STEPS["nccl_multi_rank"].gpu]), 0, "at once")))
    steps.append(("same_mpi", STEPS["same_mpi"]))
    check = STEPS["check_build"]
    jobs = [job("check_build", 1, check.host, check.gpu, scripts=[]),
            job("test_inproc", 1, INPROC.host, INPROC.gpu, config="inproc", scripts=[])]
    skipped = []
    for config in configs:
        ranks, _, _, _, needs_gpus = all_configs[config]
        if shared_nccl(config) and not multi_rank:
            skipped.append(config)  # gpu_check.sh records why, and runs nothing for it
            continue
        if needs_gpus > gpus:  # pytest starts and skips every test: the check stays in the report
            jobs.append(job("test_%s" % config, 1, SKIPS.host, SKIPS.gpu, config=config, scripts=[]))
            continue
        if shared_nccl(config):  # the measured run includes its start; its steps scale
            stress, scale = STRESS[ranks], stress_steps / 1000.0
            jobs.append(job("stress_%s" % config, ranks, JOB_START.host + (stress.host - JOB_START.host) * scale,
                            JOB_START.gpu + (stress.gpu - JOB_START.gpu) * scale, config=config,
                            scripts=["gpu_stress"]))
        jobs += config_jobs(config, ranks, config_scripts(config))
    wall, jobs, binding = pool(jobs)
    tail = [("gpu_elastic", STEPS["gpu_elastic"])] if elastic else []
    bench = {True: "1", False: "0"}.get(bench, str(bench))
    tail += [("gpu_bench", STEPS["gpu_bench"])] if bench in ("1", "all") else []
    tail += [("gpu_bench_np2", STEPS["gpu_bench_np2"])] if bench in ("np2", "all") and multi_rank else []
    out = [dict(name=name, predicted=round(c.host + c.gpu, 1)) for name, c in steps]
    out.append(dict(name="tests", predicted=wall, bound=binding, jobs=jobs, skipped=skipped))
    out += [dict(name=name, predicted=round(c.host + c.gpu, 1)) for name, c in tail]
    return dict(budget_s=BUDGET_S, call_budget_s=CALL_BUDGET_S, rank_cap=RANK_CAP, steps=out,
                predicted_s=round(sum(s["predicted"] for s in out), 1))


def show(plan):
    lines = ["plan (scripts/gpu_plan.py): predicted %.0fs of the %ds goal (issue 47); the call's budget is %ds"
             % (plan["predicted_s"], plan["budget_s"], plan["call_budget_s"])]
    if plan["predicted_s"] > plan["call_budget_s"]:
        lines.append("  OVER the call's budget: the steps past it will be NOT RUN (PERSEUS_GPU_CHECK_CONFIGS "
                     "runs fewer configurations)")
    at = 0.0
    for step in plan["steps"]:
        lines.append("  %5.0fs  %-24s %5.0fs" % (at, step["name"], step["predicted"]))
        if "jobs" in step:
            lines[-1] += "  (%d jobs, at most %d ranks at once; bound: %s)" % (
                len(step["jobs"]), plan["rank_cap"], step["bound"])
            for j in step["jobs"]:
                lines.append("           %-40s np %d  %5.0fs -> %5.0fs  (alone %.0fs, GPU %.0fs)"
                             % (j["name"], j["ranks"], at + j["start"], at + j["end"], j["alone"], j["gpu"]))
            for config in step["skipped"]:
                lines.append("           test_%-35s left out: this NCCL cannot run several ranks on one GPU"
                             % config)
        at += step["predicted"]
    return "\n".join(lines)


def step_figures(plan):
    """{step or job name: predicted seconds}, the build and the NCCL check each by its own figure."""
    figures = {}
    for step in plan["steps"]:
        if "jobs" in step:
            figures.update((j["name"], j["predicted"]) for j in step["jobs"])
        elif "+" in step["name"]:
            figures.update((name, round(sum(STEPS[name][:2]), 1)) for name in step["name"].split("+"))
        else:
            figures[step["name"]] = step["predicted"]
    return figures


def shell(plan):
    """For gpu_check.sh: PLAN_JOBS, the pool's jobs in start order ('name ranks limit;...'),
    SCRIPTS_<job> for a part's scripts, PREDICTED[name] for every step and job, DEVICE_PLAN."""
    tests = [s for s in plan["steps"] if s["name"] == "tests"][0]
    rows, out = [], []
    for j in tests["jobs"]:
        # Generous: the figures are rough, a slow pass must not become a timeout, and the
        # call's budget (gpu_check.sh's run_step) caps every limit anyway.
        limit = int(max(180, 3 * j["predicted"]))
        rows.append("%s %d %d" % (j["name"], j["ranks"], limit))
        if ".part" in j["name"]:
            out.append("SCRIPTS_%s='%s'" % (re.sub(r"\W", "_", j["name"]), " ".join(j["scripts"])))
    out.insert(0, "PLAN_JOBS='%s'" % ";".join(rows))
    out += ["PREDICTED[%s]=%d" % (name, round(value)) for name, value in step_figures(plan).items()]
    out.append("DEVICE_PLAN=%s" % shlex.quote(show(plan)))
    out += ["PLAN_RANK_CAP=%d" % plan["rank_cap"], "PLAN_PREDICTED_S=%d" % round(plan["predicted_s"]),
            "PLAN_CALL_BUDGET_S=%d" % plan["call_budget_s"]]
    return "\n".join(out)


def batch_times(log):
    """{script: seconds} from a job log's BATCH TIME lines (tests/support/rank_batch.py)."""
    found = {}
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            for m in re.finditer(r"^\[rank 0\] BATCH TIME (\w+)\[own\] ([0-9.]+)$", f.read(), re.M):
                found[m.group(1)] = float(m.group(2))
    return found


def measured(logs):
    with open(os.path.join(logs, "plan.json")) as f:
        plan = json.load(f)
    def result(name):
        try:
            with open(os.path.join(logs, name + ".result")) as f:
                text, _, took = f.read().rstrip("\n").partition("\t")
            return text, (float(took.rstrip("s")) if took else None)
        except OSError:
            return "no result", None
    rows, scripts = [], {}
    for name, predicted in step_figures(plan).items():
        text, took = result(name)
        rows.append(dict(name=name, predicted_s=predicted, measured_s=took, result=text))
        if name.startswith("test_") and name != "test_inproc":
            times = batch_times(os.path.join(logs, "job_%s.log" % name[len("test_"):]))
            if times:  # what the job took beyond its scripts: its start (and end)
                scripts[name] = dict(times, job_start=round(took - sum(times.values()), 1) if took else None)
    elapsed = None
    if os.path.exists(os.path.join(logs, "elapsed")):
        with open(os.path.join(logs, "elapsed")) as f:
            elapsed = float(f.read().strip() or 0)
    out = dict(predicted_s=plan["predicted_s"], measured_s=elapsed, steps=rows, scripts=scripts,
               note="seconds on this machine; scripts/gpu_plan.py's tables take them (docs/gpu.md)")
    with open(os.path.join(logs, "measured.json"), "w") as f:
        json.dump(out, f, indent=1)
    table = ["| step | predicted | measured | result |", "|---|---:|---:|---|"]
    table += ["| %s | %.0f s | %s | %s |" % (r["name"], r["predicted_s"],
                                              "-" if r["measured_s"] is None else "%.0f s" % r["measured_s"],
                                              r["result"]) for r in rows]
    table.append("| **whole call** | **%.0f s** | **%s** | |" % (
        plan["predicted_s"], "-" if elapsed is None else "%.0f s" % elapsed))
    return "\n".join(table)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["show", "shell", "measured"])
    parser.add_argument("logs", nargs="?")
    parser.add_argument("--configs")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--bench", choices=["0", "1", "np2", "all"], default="1")
    for flag, default in (("multi-rank", 1), ("nccl-check", 1), ("elastic", 0)):
        parser.add_argument("--" + flag, type=int, choices=[0, 1], default=default)
    parser.add_argument("--stress-steps", type=int, default=1000)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.command == "measured":
        print(measured(args.logs))
        return 0
    plan = make_plan(args.configs.split() if args.configs is not None else None, args.gpus, bool(args.multi_rank),
                     bool(args.nccl_check), args.bench, bool(args.elastic), args.stress_steps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(plan, f, indent=1)
    print(show(plan) if args.command == "show" else shell(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
