"""Autotuning against a sweep of fixed settings, in one run, by the same processes.

allreduce_bench.py --autotune and training_scaling.py --autotune call compare()
with their own step (reduce the ResNet-50 gradient set; train a model). A run of a
setting: hvd.init() with it in the environment, warm-up steps, timed steps,
hvd.shutdown(). A step's time is the slowest rank's; a run's time its median step.

1. The sweep: every fixed setting, --rounds times (the order rotates between
   rounds); the best is the one with the least median over rounds.
2. Head to head, --pairs times: the best fixed setting, PERSEUS_AUTOTUNE=1, the best
   fixed setting again. Autotune's run steps until config()'s
   PERSEUS_AUTOTUNE_STATE says it settled (the same step on every rank: the state
   changes in a round every rank applies before that step's results come back),
   then takes the same timed steps under what it chose; the fixed runs beside it
   first warm up for as many steps as it tunes. Its ratio is the mean of
   the two fixed runs beside it over its own time, so a steady drift of the shared
   machine's speed cancels; the median ratio is the number to quote (target >= 0.95).
"""
import itertools
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

KiB, MiB = 1024, 1024 * 1024

# The knobs the autotuner tries (csrc/src/engine/autotune.cc) and the defaults of
# the configuration table; the sweep is built from the same values, so the best
# fixed setting is one the tuner could also have reached.
DEFAULTS = {"PERSEUS_ALLREDUCE_STREAMS": "1", "PERSEUS_FUSION_THRESHOLD": str(64 * MiB),
            "PERSEUS_CHUNK_SIZE": str(4 * MiB), "PERSEUS_HOLD_BYTES": "auto"}
VALUES = {"PERSEUS_ALLREDUCE_STREAMS": ["1", "2", "4"],
          "PERSEUS_FUSION_THRESHOLD": [str(v * MiB) for v in (4, 16, 64, 128)],
          "PERSEUS_CHUNK_SIZE": [str(v * MiB) for v in (1, 4, 16, 64)],
          "PERSEUS_HOLD_BYTES": ["0", str(256 * KiB), str(1 * MiB), str(8 * MiB), "auto"]}
SHORT = {"PERSEUS_ALLREDUCE_STREAMS": "lanes", "PERSEUS_FUSION_THRESHOLD": "fusion",
         "PERSEUS_CHUNK_SIZE": "chunk", "PERSEUS_HOLD_BYTES": "hold"}
TUNER_VARS = ("PERSEUS_AUTOTUNE", "PERSEUS_AUTOTUNE_LOG", "PERSEUS_AUTOTUNE_WARMUP_SAMPLES",
              "PERSEUS_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG",
              "HOROVOD_FUSION_THRESHOLD")
AUTOTUNE = "autotune"


def label(setting):
    def short(v):
        if not v.isdigit():
            return v  # auto
        n = int(v)
        return "%dM" % (n // MiB) if n >= MiB and n % MiB == 0 else (
            "%dK" % (n // KiB) if n >= KiB and n % KiB == 0 else str(n))
    return " ".join("%s=%s" % (SHORT[k], v if k == "PERSEUS_ALLREDUCE_STREAMS" else short(v))
                    for k, v in setting.items())


def sweep(kind):
    """'axes': the defaults, and each knob's values with the others at their
    defaults; 'product': every combination of lanes, fusion and chunk (hold default)."""
    if kind == "product":
        keys = ["PERSEUS_ALLREDUCE_STREAMS", "PERSEUS_FUSION_THRESHOLD", "PERSEUS_CHUNK_SIZE"]
        return [dict(DEFAULTS, **dict(zip(keys, combo)))
                for combo in itertools.product(*(VALUES[k] for k in keys))]
    settings = [dict(DEFAULTS)]
    for key, values in VALUES.items():
        settings += [dict(DEFAULTS, **{key: v}) for v in values if v != DEFAULTS[key]]
    return settings


def _set_environment(setting, args):
    for k in list(DEFAULTS) + list(TUNER_VARS):
        os.environ.pop(k, None)
    if setting == AUTOTUNE:
        os.environ.update({"PERSEUS_AUTOTUNE": "1",
                           "PERSEUS_AUTOTUNE_WARMUP_SAMPLES": str(args.autotune_warmup),
                           "PERSEUS_AUTOTUNE_STEPS_PER_SAMPLE": str(args.autotune_steps)})
    else:
        os.environ.update(setting)


def _timed(comm, step, n):
    """The slowest rank's time of each of n steps."""
    times = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter()
        step()
        times[i] = time.perf_counter() - t0
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return times


def _run(comm, hvd, make_step, setting, args, warmup_steps=None):
    """(median step seconds, what autotune settled on or None, its tuning steps)."""
    _set_environment(setting, args)
    hvd.init()
    try:
        step = make_step()
        state, tuning_steps = None, 0
        if setting == AUTOTUNE:
            while not hvd.config()["PERSEUS_AUTOTUNE_STATE"].startswith("settled"):
                if tuning_steps >= args.autotune_max_steps:
                    raise RuntimeError("autotune did not settle in %d steps" % tuning_steps)
                step()
                tuning_steps += 1
            state = hvd.config()["PERSEUS_AUTOTUNE_STATE"]
        for _ in range(args.warmup_steps if warmup_steps is None else warmup_steps):
            step()
        median = float(np.median(_timed(comm, step, args.timed_steps)))
    finally:
        hvd.shutdown()
        _set_environment({}, args)
    return median, state, tuning_steps


def compare(hvd, make_step, work_per_step, unit, args, log=print):
    """Finds the best fixed setting (args.rounds rounds of the sweep), then runs
    [best fixed, autotune, best fixed] args.pairs times. Prints the tables on rank 0
    and returns there the median of autotune's settled throughput over the mean of
    the fixed runs beside it (a steady drift of the machine cancels out)."""
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def measure(setting, name, tag, warmup_steps=None):
        median, state, tuning_steps = _run(comm, hvd, make_step, setting, args, warmup_steps)
        if rank == 0 and args.verbose:
            log("%-12s %-40s %8.2f ms/step%s" % (tag, name, median * 1e3,
                                                 "  " + state if state else ""))
        return median, state, tuning_steps

    settings = sweep(args.sweep)
    times = {label(s): [] for s in settings}
    for r in range(args.rounds):
        shift = r * len(settings) // max(1, args.rounds)
        for s in settings[shift:] + settings[:shift]:
            times[label(s)].append(measure(s, label(s), "sweep %d" % (r + 1))[0])
    fixed = sorted((statistics.median(v), k) for k, v in times.items())
    best_name = fixed[0][1]
    best = next(s for s in settings if label(s) == best_name)

    # Autotune's timed steps come after its tuning steps: the fixed runs beside it get
    # as many warm-up steps (1 + all its samples), so neither side is measured colder.
    samples = args.autotune_warmup + 2 * sum(len(v) for v in VALUES.values())
    warm = 2 + samples * args.autotune_steps + args.warmup_steps
    ratios, runs = [], []
    for p in range(args.pairs):
        before = measure(best, best_name, "pair %d" % (p + 1), warm)[0]
        tuned, state, steps = measure(AUTOTUNE, AUTOTUNE, "pair %d" % (p + 1))
        after = measure(best, best_name, "pair %d" % (p + 1), warm)[0]
        ratios.append((before + after) / 2 / tuned)
        runs.append((before, tuned, after, state, steps))
    if rank != 0:
        return None
    log("")
    log("Sweep of %d fixed settings (%s), %d ranks, %d round(s); a setting's time is the "
        "median over rounds of its median step (the slowest rank's)"
        % (len(fixed), args.sweep, comm.Get_size(), args.rounds))
    log("")
    log("| setting | median step | %s |" % unit)
    log("|---|---:|---:|")
    for t, k in fixed:
        log("| %s | %.2f ms | %.4g |" % (k, t * 1e3, work_per_step / t))
    log("")
    log("Autotune (PERSEUS_AUTOTUNE=1, %d warm-up samples of %d steps) between two runs of "
        "the best fixed setting (%s):" % (args.autotune_warmup, args.autotune_steps, best_name))
    log("")
    log("| pair | fixed before | autotune settled | fixed after | autotune / fixed "
        "(throughput) | tuning steps | settled on |")
    log("|---:|---:|---:|---:|---:|---:|---|")
    for i, ((before, tuned, after, state, steps), ratio) in enumerate(zip(runs, ratios)):
        log("| %d | %.2f ms | %.2f ms | %.2f ms | %.3f | %d | %s |"
            % (i + 1, before * 1e3, tuned * 1e3, after * 1e3, ratio, steps,
               state.replace("settled: ", "")))
    ratio = statistics.median(ratios)
    log("")
    log("autotune settled throughput / best fixed: median %.3f over %d pairs (target >= 0.95: %s)"
        % (ratio, len(ratios), "met" if ratio >= 0.95 else "NOT met"))
    return ratio


def add_arguments(parser):
    g = parser.add_argument_group("--autotune comparison")
    g.add_argument("--rounds", type=int, default=2, help="rounds of the sweep (default 2)")
    g.add_argument("--pairs", type=int, default=3,
                   help="autotune runs, each between two runs of the best fixed setting "
                        "(default 3)")
    g.add_argument("--sweep", choices=("axes", "product"), default="axes",
                   help="fixed settings: each knob's values around the defaults (axes, "
                        "default), or every lanes x fusion x chunk combination (product)")
    g.add_argument("--timed-steps", type=int, default=15, help="timed steps per setting")
    g.add_argument("--warmup-steps", type=int, default=3, help="untimed steps per setting")
    g.add_argument("--autotune-warmup", type=int, default=3,
                   help="PERSEUS_AUTOTUNE_WARMUP_SAMPLES (default 3, Horovod's)")
    g.add_argument("--autotune-steps", type=int, default=10,
                   help="PERSEUS_AUTOTUNE_STEPS_PER_SAMPLE (default 10, Horovod's)")
    g.add_argument("--autotune-max-steps", type=int, default=5000,
                   help="fail if autotune has not settled after this many steps")
    g.add_argument("--verbose-compare", dest="verbose", action="store_true",
                   help="print each setting's time as it is measured")
