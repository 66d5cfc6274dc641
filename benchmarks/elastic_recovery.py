"""How long a lost rank costs: from a SIGKILL to the survivors' next completed step,
on Open MPI 5 with ULFM (issue 46), split into its phases; with --hosts-added, how
long a host added or removed costs under perseusrun --host-discovery-script.

    .venv/bin/python benchmarks/elastic_recovery.py [--nps 2 4 8] [--repeat 3]

Builds (or finds in ~/.cache/perseus) the core against .venv-ompi5's Open MPI 5 (bash
scripts/setup_ompi5.sh makes it), then for each np runs `mpirun --with-ft ulfm -np N`
of this file in worker mode --repeat times. The workers train a small model with
DistributedOptimizer and commit after every step; at step 10 the last rank SIGKILLs
itself, after writing the time. Rank 0 of the survivors times, in wall-clock seconds
from the kill:

  detection   until its step raised HorovodInternalError (the failure noticed, the
              world's communicators revoked, the error on every survivor);
  teardown    shutdown() of the failed world's engine;
  shrink+init init(): MPIX_Comm_shrink to the survivors and the new engine;
  sync        the state synced from the new rank 0 (parameters, optimizer);
  next step   the first step in the new world, completed.

Medians over the repeats are printed as a table, with the goals of issue 46
(detection <= 1 s, the whole recovery <= 2 s at np 4). The baselines, in the same
runs: a step without failure, with ULFM on, and a step of a run of the same core
started without it (`mpirun` without --with-ft, nobody killed): what ULFM costs while
nothing fails. The ranks share the cores (2 on CI): times at np 8 are those of an
oversubscribed machine.

    .venv/bin/python benchmarks/elastic_recovery.py --hosts-added [--nps 2 4] [--repeat 3]

The other table: what a change of hosts costs, on the default MPICH core (any MPI:
the job follows its hosts by restarting at a commit). One job of `perseusrun --elastic
--host-discovery-script "cat F" --min-np A --max-np B` per repeat goes A -> B -> A
ranks, the hosts simulated on this machine as tests/mpi/test_fault_tolerance.py's
test_the_job_follows_its_hosts does (F says localhost:A, then localhost:B, then
localhost:A again). The ranks take STEP_S per step (a sleep standing for the step's
compute, so that the ranks leave perseusrun's discovery its share of the CPUs) and
commit after each; rank 0 rewrites F CHANGE_STEP steps into each run but the last.
From that moment (the discovery script prints the new hosts), in wall-clock seconds:

  noticed     until perseusrun's discovery (every DISCOVER_PERIOD_S, Horovod's 1 s)
              sees the change and tells the ranks (its "the hosts changed" line);
  interrupt   until rank 0 has raised HostsUpdatedInterrupt at its next commit (with
              every rank: one broadcast), persisted that commit and shut down;
  exit        until perseusrun sees mpirun end with the restart code (its
              "restarting the job" line): the ranks' interpreters end, then mpirun;
  launch      until rank 0's script runs again: mpirun and the interpreters start;
  init        until hvd.init() returns in the new world (importing torch included);
  model       until the script has built its model, optimizer and state (torch's
              own cost: its first optimizer imports torch._dynamo, sympy and more,
              some 870 modules with torch 2.13);
  resume      until hvd.elastic.run calls the training function: the persisted
              commit loaded, synced from rank 0, the reset callbacks run;
  first step  the first step in the new world, completed (and committed).

From launch to the first step is the restart proper; its floor is a cold start of the
same job at the new size, measured in the same run (`perseusrun -np N`, no --elastic,
from perseusrun's start to the first step). Medians over --repeat jobs.

    .venv/bin/python benchmarks/elastic_recovery.py --hosts-added --in-place [--nps 2 4]

The same changes on the Open MPI 5 core (ULFM), where the job shrinks and grows in place
instead of restarting: one job goes B -> A -> B ranks, ranks 0 to A-1 in the same
processes throughout (ranks A and up leave, then new processes are spawned for them;
the other order would not stay in place: a process a grow spawned cannot leave, see
docs/elastic.md). From the change:

  noticed     as above;
  resized     until rank 0's reset callback runs at the new size: the interrupt at its
              next commit, then the spawn and merge of the new processes (their
              interpreters start, import torch and Perseus, and join) or the split that
              lets the others leave, and init() over the new world;
  first step  the state synced from rank 0 and the first step at the new size,
              completed and committed.

The same run then measures the restart's table above (the MPICH core, A -> B -> A) and
prints the ratio of the totals, restart over in place, for each direction (the cores
differ, so the ratio is rough).
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KILL_STEP, STEPS = 10, 14
PHASES = ["detection", "teardown", "shrink+init", "sync", "next step"]
# --hosts-added: a step's stand-in compute, the step of each run that changes the
# hosts, the steps of the last run, and how long a run may wait for its interrupt.
STEP_S, CHANGE_STEP, LAST_RUN_STEPS, RUN_LIMIT_S = 0.02, 5, 5, 300
GROW_PHASES = ["noticed", "interrupt", "exit", "launch", "init", "model", "resume",
               "first step"]
IN_PLACE_PHASES = ["noticed", "resized", "first step"]


def _training(torch, hvd, **tracked):
    """(model, optimizer, state, x): the small model both modes train, the same on every
    rank; `tracked`: more values the state keeps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0, **tracked)
    return model, optimizer, state, torch.randn(32, 64)


def _paced_step(model, optimizer, x, state):
    """One step of the grow workers: STEP_S of stand-in compute, then the model's."""
    time.sleep(STEP_S)
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
    state.step += 1


def _write_hosts(hosts_file, text):
    """What the discovery script (`cat hosts_file`) prints from now on, all at once."""
    tmp = hosts_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, hosts_file)


def worker(out_dir, kill=True):
    import torch

    import perseus.torch.horovod as hvd
    from perseus.common import basics
    hvd.init()
    victim = hvd.size() - 1
    model, optimizer, state, x = _training(torch, hvd)

    def step():
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        state.step += 1
        state.commit()

    state.sync()
    step_times = []
    marks = {}
    while state.step < STEPS:
        if kill and state.step == KILL_STEP and hvd.rank() == victim and "detection" not in marks:
            (Path(out_dir) / "killed").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.time()
        try:
            step()
            step_times.append(time.time() - start)
            if "sync" in marks and "next step" not in marks:
                marks["next step"] = time.time()
        except hvd.HorovodInternalError:
            marks["detection"] = time.time()
            state.restore()
            basics.shutdown()
            marks["teardown"] = time.time()
            basics.init()
            marks["shrink+init"] = time.time()
            state.sync()
            marks["sync"] = time.time()
    if hvd.rank() == 0 and not kill:
        (Path(out_dir) / "phases.json").write_text(json.dumps(
            {"step without ULFM": statistics.median(step_times)}))
    elif hvd.rank() == 0:
        killed = float((Path(out_dir) / "killed").read_text())
        previous, phases = killed, {}
        for phase in PHASES:
            phases[phase] = marks[phase] - previous
            previous = marks[phase]
        phases["total"] = marks["next step"] - killed
        phases["step, ULFM on"] = statistics.median(step_times)
        (Path(out_dir) / "phases.json").write_text(json.dumps(phases))
    hvd.shutdown()


def grow_worker(out_dir, hosts_file, changes):
    """A rank of the --hosts-added job (or of its cold-start baseline: no changes).
    Rank 0 writes its times to run<k>.json, k = perseusrun's restart number."""
    started = time.time()
    import torch

    import perseus.torch.horovod as hvd
    hvd.init()
    marks = {"started": started, "init": time.time()}
    rank = hvd.rank()
    attempt = int(os.environ.get("PERSEUS_ELASTIC_RESTARTS", "0"))
    changing = attempt < len(changes)  # this run rewrites the hosts, then is stopped
    model, optimizer, state, x = _training(torch, hvd)
    marks["model"] = time.time()

    @hvd.elastic.run
    def train(state):
        marks.setdefault("resume", time.time())
        first = state.step
        while True:
            _paced_step(model, optimizer, x, state)
            done = state.step - first
            if changing and rank == 0 and done == CHANGE_STEP:
                _write_hosts(hosts_file, changes[attempt])
                marks["change"] = time.time()
            state.commit()  # raises HostsUpdatedInterrupt (then SystemExit) when told
            marks.setdefault("first step", time.time())
            if not changing and done >= LAST_RUN_STEPS:
                return
            if time.time() - marks["init"] > RUN_LIMIT_S:
                raise RuntimeError("no HostsUpdatedInterrupt %d s into run %d"
                                   % (RUN_LIMIT_S, attempt))

    def report():
        if rank == 0:
            (Path(out_dir) / ("run%d.json" % attempt)).write_text(json.dumps(marks))

    try:
        train(state)
    except SystemExit:  # the stop for new hosts: hvd.elastic.run persisted and shut down
        marks["interrupt"] = time.time()
        report()
        raise
    report()
    hvd.shutdown()


def in_place_worker(out_dir, hosts_file, changes):
    """A rank of the --in-place job, which grows and shrinks in place: rank 0 (the same
    process throughout) makes each change CHANGE_STEP steps after the last and writes
    every change's times to in_place.json. The count of changes made travels in the
    state (rank 0's reset callback counts, the sync gives it to all, the new ranks too),
    so that every rank stops at the same step after the last."""
    import torch

    import perseus.torch.horovod as hvd
    from perseus.common import basics
    hvd.init()
    model, optimizer, state, x = _training(torch, hvd, resizes=0)
    first_rank0 = hvd.rank() == 0 and not basics.joined_job()
    marks = []  # rank 0's: one {change, resized, first step} a change

    def on_reset():
        if first_rank0:
            marks[-1]["resized"] = time.time()
            state.resizes += 1
            state.save()  # the sync that follows gives every rank the saved values

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        done = 0  # steps since this call, the same on every rank
        while True:
            _paced_step(model, optimizer, x, state)
            done += 1
            if first_rank0 and done == CHANGE_STEP and len(marks) < len(changes):
                _write_hosts(hosts_file, changes[len(marks)])
                marks.append({"change": time.time()})
            state.commit()  # raises HostsUpdatedInterrupt when told: grown or shrunk
            if first_rank0 and marks and "first step" not in marks[-1] and "resized" in marks[-1]:
                marks[-1]["first step"] = time.time()
            if state.resizes == len(changes) and done >= LAST_RUN_STEPS:
                return
            if done * STEP_S > RUN_LIMIT_S:
                raise RuntimeError("no HostsUpdatedInterrupt in %d steps" % done)

    train(state)
    if first_rank0:
        (Path(out_dir) / "in_place.json").write_text(json.dumps(marks))
    hvd.shutdown()


class _Lines(threading.Thread):
    """perseusrun's stderr, each line with the time it came."""

    def __init__(self, pipe):
        super().__init__(daemon=True)
        self.pipe, self.lines = pipe, []

    def run(self):
        for line in self.pipe:
            self.lines.append((time.time(), line.decode(errors="replace")))

    def times(self, text):
        return [t for t, line in self.lines if text in line]


def _perseusrun(flags, out, env, changes=(), hosts_file="", python=None):
    """Runs perseusrun with flags on this file's grow worker (with `python`: the ULFM
    core's, its in-place worker) -> (its start time, its stderr lines, rank 0's runs'
    marks)."""
    mode, isolated = ("--in-place-worker", ["-P"]) if python else ("--grow-worker", [])
    python = str(python or sys.executable)
    # -P: perseus from PYTHONPATH (the ULFM core's package), not this checkout's.
    cmd = [python] + isolated + ["-m", "perseus.launcher"] + flags + [
        python] + isolated + [str(Path(__file__).resolve()), mode, out,
        "--hosts-file", hosts_file, "--changes", ";".join(changes)]
    start = time.time()
    proc = subprocess.Popen(cmd, env=env, cwd=str(REPO), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = _Lines(proc.stderr)
    lines.start()
    try:
        proc.wait(timeout=RUN_LIMIT_S + 60 * (len(changes) + 1))
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.join(timeout=10)
    if proc.returncode != 0:
        sys.exit("elastic_recovery: %s ended with %d:\n%s" % (
            " ".join(cmd), proc.returncode, "".join(l for _, l in lines.lines)[-6000:]))
    if mode == "--in-place-worker":
        return start, lines, json.loads((Path(out) / "in_place.json").read_text())
    runs = [json.loads((Path(out) / ("run%d.json" % k)).read_text())
            for k in range(len(changes) + 1)]
    return start, lines, runs


def hosts_added(nps, repeat):
    """The --hosts-added table: A -> B -> A ranks, per job, and cold starts at B and A."""
    small, large = nps
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "HOROVOD_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    columns = ["%d -> %d" % (small, large), "%d -> %d" % (large, small)]
    results = {}

    def add(name, column, seconds):
        results.setdefault(name, {}).setdefault(column, []).append(seconds)

    for run in range(repeat):
        print("run %d of %d: %d -> %d -> %d ranks, then cold starts ..."
              % (run + 1, repeat, small, large, small), file=sys.stderr, flush=True)
        out = tempfile.mkdtemp(prefix="perseus-hosts-")
        hosts = Path(out) / "hosts"
        hosts.write_text("localhost:%d\n" % small)
        changes = ["localhost:%d" % large, "localhost:%d" % small]
        job_env = dict(env, PERSEUS_ELASTIC_PERSIST_DIR=str(Path(out) / "commits"))
        _, lines, runs = _perseusrun(
            ["--elastic", "--host-discovery-script", "cat %s" % hosts,
             "--min-np", str(min(nps)), "--max-np", str(max(nps))],
            out, job_env, changes, str(hosts))
        noticed = lines.times("perseusrun: --elastic: the hosts changed:")
        exited = lines.times("the ranks stopped at a commit for the new hosts")
        for k, column in enumerate(columns):
            before, after = runs[k], runs[k + 1]
            times = [before["change"], noticed[k], before["interrupt"], exited[k],
                     after["started"], after["init"], after["model"], after["resume"],
                     after["first step"]]
            for name, (t0, t1) in zip(GROW_PHASES, zip(times, times[1:])):
                add(name, column, t1 - t0)
            add("total", column, after["first step"] - before["change"])
            add("restart: launch to first step", column, after["first step"] - exited[k])
            print("  %s: total %.3f s" % (column, results["total"][column][-1]),
                  file=sys.stderr, flush=True)
        shutil.rmtree(out, ignore_errors=True)
        for np, column in ((large, columns[0]), (small, columns[1])):
            cold = tempfile.mkdtemp(prefix="perseus-cold-")
            start, _, (marks,) = _perseusrun(["-np", str(np)], cold, env)
            add("cold start: to init", column, marks["init"] - start)
            add("cold start: to first step", column, marks["first step"] - start)
            shutil.rmtree(cold, ignore_errors=True)
    names = GROW_PHASES + ["total", "restart: launch to first step", "cold start: to init",
                           "cold start: to first step"]
    print("| phase | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name in names:
        cells = ["%.3f s" % statistics.median(results[name][c]) for c in columns]
        print("| %s | %s |" % (name, " | ".join(cells)))
    print("Medians of %d jobs. Cold start: perseusrun -np N at the new size (%d, then %d), "
          "no --elastic, from perseusrun's start (whose own start-up a restart skips): the "
          "restart's floor." % (repeat, large, small))
    return results


def in_place(nps, repeat):
    """The --in-place table: B -> A -> B ranks in one job on the ULFM core."""
    small, large = nps
    bin_dir, pythonpath = ulfm_package()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "HOROVOD_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=pythonpath)
    columns = ["%d -> %d" % (large, small), "%d -> %d" % (small, large)]
    results = {}
    for run in range(repeat):
        print("run %d of %d: %d -> %d -> %d ranks in place ..." % (run + 1, repeat, large,
                                                                   small, large),
              file=sys.stderr, flush=True)
        out = tempfile.mkdtemp(prefix="perseus-in-place-")
        hosts = Path(out) / "hosts"
        hosts.write_text("localhost:%d\n" % large)
        _, lines, marks = _perseusrun(
            ["--elastic", "--mpirun", str(bin_dir / "mpirun"), "--host-discovery-script",
             "cat %s" % hosts, "--min-np", str(small), "--max-np", str(large)],
            out, dict(env, PERSEUS_ELASTIC_PERSIST_DIR=str(Path(out) / "commits")),
            ["localhost:%d" % small, "localhost:%d" % large], str(hosts), bin_dir / "python")
        noticed = lines.times("perseusrun: --elastic: the hosts changed:")
        if lines.times("(run 1)"):
            sys.exit("elastic_recovery: the job restarted instead of changing in place:\n"
                     + "".join(line for _, line in lines.lines)[-6000:])
        for k, column in enumerate(columns):
            m = marks[k]
            times = [m["change"], noticed[k], m["resized"], m["first step"]]
            for name, (t0, t1) in zip(IN_PLACE_PHASES, zip(times, times[1:])):
                results.setdefault(name, {}).setdefault(column, []).append(t1 - t0)
            results.setdefault("total", {}).setdefault(column, []).append(
                m["first step"] - m["change"])
            print("  %s: total %.3f s" % (column, results["total"][column][-1]),
                  file=sys.stderr, flush=True)
        shutil.rmtree(out, ignore_errors=True)
    print("| phase | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name in IN_PLACE_PHASES + ["total"]:
        cells = ["%.3f s" % statistics.median(results[name][c]) for c in columns]
        print("| %s | %s |" % (name, " | ".join(cells)))
    print("Medians of %d jobs, in place on the Open MPI 5 core (ULFM): one job, the ranks "
          "of the smaller size in the same processes throughout." % repeat)
    print()
    restart = hosts_added(nps, repeat)
    print()
    for column in columns:
        ratio = (statistics.median(restart["total"][column])
                 / statistics.median(results["total"][column]))
        print("%s: the restart (MPICH) takes %.1fx the time in place (total, medians)"
              % (column, ratio))


def ulfm_package():
    """A PYTHONPATH folder whose perseus package runs on the Open MPI 5 build."""
    sys.path.insert(0, str(REPO / "build_support"))
    from other_mpi_core import build_core, package
    bin_dir = REPO / ".venv-ompi5" / "bin"
    if not (bin_dir / "mpicxx").exists():
        sys.exit("elastic_recovery: .venv-ompi5 not found: bash scripts/setup_ompi5.sh")
    core = build_core("open_mpi5_core", str(bin_dir / "mpicxx"))
    return bin_dir, package(core, Path(tempfile.mkdtemp(prefix="perseus-ulfm-")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nps", type=int, nargs="+",
                        help="the sizes (default 2 4 8; with --hosts-added, the two sizes "
                             "A B of the job A -> B -> A, default 2 4)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hosts-added", action="store_true",
                        help="time a change of hosts under perseusrun --elastic "
                             "--host-discovery-script (MPICH core) instead of a SIGKILL")
    parser.add_argument("--in-place", action="store_true",
                        help="with --hosts-added: on the Open MPI 5 core (ULFM), where the "
                             "job grows and shrinks in place")
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--in-place-worker", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--no-kill", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--grow-worker", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--hosts-file", help=argparse.SUPPRESS)
    parser.add_argument("--changes", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, kill=not args.no_kill)
    if args.in_place_worker:
        return in_place_worker(args.in_place_worker, args.hosts_file,
                               [c for c in args.changes.split(";") if c])
    if args.grow_worker:
        return grow_worker(args.grow_worker, args.hosts_file,
                           [c for c in args.changes.split(";") if c])
    if args.hosts_added:
        nps = args.nps or [2, 4]
        if len(nps) != 2 or not 1 <= nps[0] < nps[1]:
            parser.error("--hosts-added takes two sizes, --nps A B with 1 <= A < B")
        return (in_place if args.in_place else hosts_added)(nps, args.repeat)
    args.nps = args.nps or [2, 4, 8]
    bin_dir, pythonpath = ulfm_package()
    results = {}
    for np in args.nps:
        for run in range(args.repeat):
            # Alternately: a run with a kill (ULFM on), and one without ULFM or a kill.
            for ulfm in (True, False):
                print("np %d, run %d of %d%s ..." % (np, run + 1, args.repeat,
                                                     "" if ulfm else ", without ULFM"),
                      file=sys.stderr, flush=True)
                out = tempfile.mkdtemp(prefix="perseus-recovery-")
                cmd = [str(bin_dir / "mpirun")] + (["--with-ft", "ulfm"] if ulfm else []) + [
                    "--allow-run-as-root", "--oversubscribe", "--mca", "plm_rsh_agent", "false",
                    "-np", str(np), str(bin_dir / "python"), "-P", str(Path(__file__).resolve()),
                    "--worker", out] + ([] if ulfm else ["--no-kill"])
                env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1")
                subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=300)
                phases = json.loads((Path(out) / "phases.json").read_text())
                for name, seconds in phases.items():
                    results.setdefault(name, {}).setdefault(np, []).append(seconds)
    names = PHASES + ["total", "step, ULFM on", "step without ULFM"]
    print("| phase | " + " | ".join("np %d" % np for np in args.nps) + " |")
    print("|---|" + "---:|" * len(args.nps))
    for name in names:
        cells = ["%.3f s" % statistics.median(results[name][np]) for np in args.nps]
        print("| %s | %s |" % (name, " | ".join(cells)))
    print("Medians of %d runs each. Goals (issue 46): detection <= 1 s, total <= 2 s at np 4."
          % args.repeat)


if __name__ == "__main__":
    main()
