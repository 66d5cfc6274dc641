"""Runs PyTorch's own distributed test suite against one torch.distributed backend, under
mpirun, so that "perseus" and "gloo" can be compared on the same machine:

    mpirun -np N python tests/torch_suite/run_distributed_test.py --backend {perseus,gloo}
        [--select REGEX] [--json OUT] [--port P] [--pg-timeout S] [--test-timeout S]
    python tests/torch_suite/run_distributed_test.py --compare GLOO.json PERSEUS.json

The suite is DistributedTest._DistTestBase of
torch/testing/_internal/distributed/distributed_test.py, shipped in the torch wheel.
PyTorch runs it with test/distributed/test_distributed_spawn.py, whose parent process
spawns WORLD_SIZE children per test; each child makes a fresh default group over a
file store, runs the one test and exits. Here mpirun starts the ranks once (Perseus's
ranks are MPI's, so they cannot be spawned per test), and every rank runs the same tests
in the same order, each the way such a child does (run_one()): a fresh default group,
the harness's file barrier before and after, then destroy_process_group().

Per test, every rank records passed / failed (the first lines of its error) / skipped
(the reason); rank 0 merges the ranks' outcomes (failed on any rank: failed; else
skipped on any: skipped), prints a line per test and the counts, and writes OUT.

Bounding time. A collective that a peer never joins fails within the group's timeout
(--pg-timeout, as torch's own harness sets one per test; gloo and perseus both honour
it). A test that still runs past --test-timeout (a rank stuck where no timeout reaches)
ends the job: a watchdog thread prints the rank's Python stacks, rank 0 writes OUT with
the results so far, that test failed ("timed out") and named in "ended_at_timeout", and
the rank exits 124, which makes mpirun end the others. `--resume OUT` then starts a new
job after that test, keeping OUT's results (tests/torch_suite/README.md has the loop).
"""

import argparse
import datetime
import faulthandler
import json
import os
import re
import sys
import tempfile
import threading
import time
import traceback
import unittest


def launcher_rank_size():
    """This process's rank and the world's size, as the MPI launcher sets them: MPICH's
    hydra (PMI_*), Open MPI (OMPI_COMM_WORLD_*). Nothing is read from MPI itself, so a
    gloo run never loads an MPI library."""
    for rank, size in (("PMI_RANK", "PMI_SIZE"),
                       ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    sys.exit("run_distributed_test.py: no PMI_RANK/PMI_SIZE or OMPI_COMM_WORLD_RANK/SIZE: "
             "start it under mpirun -np N")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("perseus", "gloo"))
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                   help="no run: the tests whose outcome differs between two summaries")
    p.add_argument("--select", help="run only the tests whose name matches this regex "
                   "(re.search)")
    p.add_argument("--json", help="where rank 0 writes the summary")
    p.add_argument("--port", type=int, default=int(os.environ.get("TORCH_SUITE_PORT", 29400)),
                   help="port of the harness's own TCPStore on 127.0.0.1, served by rank 0 "
                   "(default $TORCH_SUITE_PORT or 29400); two jobs at once need two ports")
    p.add_argument("--pg-timeout", type=float, default=30.0,
                   help="the default group's timeout in seconds (torch's harness: 60, and "
                   "its CUSTOM_PG_TIMEOUT for a few tests, which is kept)")
    p.add_argument("--test-timeout", type=float, default=120.0,
                   help="seconds one test may take on a rank before the job is ended")
    p.add_argument("--gloo-name-checks", action="store_true",
                   help="diagnostic: the suite's checks of the backend's name, made when it "
                   "is imported (BACKEND != \"gloo\"), see \"gloo\", while the tests run "
                   "on --backend: which tests that skip by name alone would pass")
    p.add_argument("--resume", help="a summary written by an earlier job that ended at a "
                   "timeout: its results are kept and the job goes on after the last test "
                   "it has")
    args = p.parse_args()
    if not (args.backend or args.compare):
        p.error("--backend or --compare is needed")
    return args


def compare(path_a, path_b):
    """Prints each summary's counts and the tests whose outcome differs, each with why
    the other side did not pass (its error's first line, or its skip reason)."""
    a, b = (json.load(open(path)) for path in (path_a, path_b))
    for s in (a, b):
        print("%-8s np %d: %s, %.0f s" % (s["backend"], s["world_size"], s["counts"], s["wall_s"]))

    def why(result):
        if result is None:
            return "not run"
        if result["outcome"] == "failed":
            return next(iter(result["error"].values())).splitlines()[0]
        return result.get("reason", "")

    for first, second in ((a, b), (b, a)):
        names = sorted(n for n, r in first["tests"].items() if r["outcome"] == "passed"
                       and (second["tests"].get(n) or {}).get("outcome") != "passed")
        print("\n%d passed on %s, not on %s:" % (len(names), first["backend"], second["backend"]))
        for n in names:
            other = second["tests"].get(n)
            print("  %-55s %-7s %s" % (n, other["outcome"] if other else "-", why(other)[:140]))
    return 0


class HarnessStore:
    """The harness's own TCPStore (not the tests' groups, which come and go): rank 0
    serves it; it carries the run's folder, the syncs between tests and each rank's
    outcomes."""

    def __init__(self, rank, size, port, timeout_s):
        import torch.distributed as dist
        self.rank, self.size = rank, size
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore("127.0.0.1", port, size, is_master=(rank == 0),
                                   timeout=self.timeout)
        # A second connection, for the watchdog thread: a client is one socket, which the
        # main thread may be blocked on (a sync waiting for a stuck rank).
        self.side = dist.TCPStore("127.0.0.1", port, size, is_master=False,
                                  timeout=datetime.timedelta(seconds=10))

    def sync(self, key, timeout_s=None):
        """Every rank reaches `key` before any goes on."""
        if self.store.add("arrived/" + key, 1) == self.size:
            self.store.set("go/" + key, "1")
        timeout = self.timeout if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        self.store.wait(["go/" + key], timeout)

    def share(self, key, value=None):
        """Rank 0's value of `key`, on every rank."""
        if self.rank == 0:
            self.store.set(key, value)
        return self.store.get(key).decode()


def extend_backend_features(backend):
    """Makes "perseus" count as gloo where the harness keys what it runs by backend name
    in sets it exposes. Done before distributed_test is imported: its decorators read
    these sets when the module is imported (as torch_ucc's runner does for "ucc").

    torch/testing/_internal/common_distributed.py, DistTestCases:
      backend_feature["ddp"]       DDP tests            (gloo is in it)
      backend_feature["subgroup"]  new_group tests      (gloo is in it)
      backend_feature["gpu"], ["cuda"]: GPU tests (gloo is in them); on a CPU-only
          machine they skip for lack of GPUs for both backends, not for perseus's name
      backend_feature["plugin"]    require_backend_is_available() takes a backend in it
          as available: the set is for backends registered with register_backend
    Left as they are, on purpose:
      skip_collective[...]  gloo is in none of them; perseus is kept out too, so that
          what perseus refuses (all_gather_coalesced, send/recv from any source) shows
          up as a failure beside gloo's pass rather than as a skip.
      PROFILING_SUPPORTED_BACKENDS, CUDA_/SEND_RECV_PROFILING_SUPPORTED_BACKENDS (lists
          in the suite's module): a backend in them must record profiler events named
          "<backend>:<op>", which gloo's C++ group does and a group written in Python
          does not; perseus stays out, so those tests check the collectives' results
          only (as for any backend not listed).
    Not extendable without editing the torch install: checks that compare the name
    itself (BACKEND != "gloo", e.g. "Only gloo backend supports timeouts", "GLOO Batch
    Send Recv CPU"); those tests skip for perseus, and the summary says so."""
    from torch.testing._internal.common_distributed import DistTestCases
    if backend == "perseus":
        for feature in ("ddp", "subgroup", "gpu", "cuda", "plugin"):
            DistTestCases.backend_feature[feature].add("perseus")


def first_lines(exc, n=6):
    """The exception's own message (first n lines) and where in the test it was raised."""
    lines = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    where = [f for f in traceback.extract_tb(exc.__traceback__)
             if "distributed_test.py" in f.filename]
    at = ["  at distributed_test.py:%d %s" % (where[-1].lineno, where[-1].name)] if where else []
    return "\n".join(lines[:n] + at)


class Watchdog:
    """Ends the job when a test runs past its time on this rank: prints the stacks,
    lets rank 0 write the summary so far (on_timeout), and exits 124 (mpirun then ends
    the other ranks). faulthandler's C thread is the backstop, should the GIL be held."""

    def __init__(self, rank, on_timeout):
        self.rank, self.on_timeout = rank, on_timeout
        self.armed = None

    def arm(self, index, name, seconds):
        done = threading.Event()
        self.armed = done

        def watch():
            if done.wait(seconds):
                return
            print("\n[torch_suite] %s ran past %g s on this rank; stacks:" % (name, seconds),
                  file=sys.stderr, flush=True)
            faulthandler.dump_traceback(all_threads=True)
            try:
                self.on_timeout(index, name)
                time.sleep(0 if self.rank == 0 else 5)  # rank 0 writes before mpirun ends all
            finally:
                os._exit(124)

        threading.Thread(target=watch, daemon=True).start()
        faulthandler.dump_traceback_later(seconds + 30, exit=True)

    def disarm(self):
        self.armed.set()
        faulthandler.cancel_dump_traceback_later()


def main():
    args = parse_args()
    if args.compare:
        return compare(*args.compare)
    rank, size = launcher_rank_size()
    try:
        import expecttest  # noqa: F401  torch's test modules import it; the wheel lacks it
    except ImportError:
        sys.exit("run_distributed_test.py needs expecttest: pip install expecttest")
    started = time.monotonic()

    # Set before anything of torch's test packages is imported: the suite's module
    # reads BACKEND (and INIT_METHOD) when imported, and WORLD_SIZE / TEMP_DIR as
    # tests run. TEMP_DIR is shared by the ranks (one machine): the harness's file
    # barrier and test_get_rank meet there.
    os.environ.update(BACKEND="gloo" if args.gloo_name_checks else args.backend,
                      WORLD_SIZE=str(size), RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      # torch's "To execute this test, run ..." names a command that is
                      # wrong here: not appended to the errors
                      PYTORCH_PRINT_REPRO_ON_FAILURE="0")
    import torch
    import torch.distributed as dist

    store = HarnessStore(rank, size, args.port, args.test_timeout + 60)
    run_dir = store.share("run_dir", tempfile.mkdtemp(prefix="torch_suite_") if rank == 0
                          else None)
    os.environ["TEMP_DIR"] = run_dir
    # Module-level INIT_METHOD must be file:// for test_barrier_timeout_global (which
    # re-initializes with it); run_one() points it at a fresh file per test.
    os.environ["INIT_METHOD"] = "file://" + os.path.join(run_dir, "shared_init_file")

    extend_backend_features(args.backend)
    if args.backend == "perseus":
        import perseus.torch  # noqa: F401  registers the "perseus" backend
    from torch.testing._internal import common_utils
    from torch.testing._internal.common_distributed import TEST_SKIPS
    from torch.testing._internal.distributed import distributed_test as dt
    if args.gloo_name_checks:  # the decorators have seen "gloo"; the tests run on --backend
        dt.BACKEND = os.environ["BACKEND"] = args.backend

    # The class torch's spawn harness runs (TestDistBackendWithSpawn), minus the spawning:
    # TestDistBackend gives world_size and the harness's properties; its setUp (which
    # spawns) is never called, as it is not in a spawned child.
    class Suite(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        pass

    names = unittest.TestLoader().getTestCaseNames(Suite)
    if args.select:
        names = [n for n in names if re.search(args.select, n)]
    skip_codes = {s.exit_code: s.message for s in TEST_SKIPS.values()}

    results, earlier_s = {}, 0.0
    if args.resume:
        with open(args.resume) as f:
            earlier = json.load(f)
        results, earlier_s = earlier["tests"], earlier["wall_s"]
    summary_path = args.json

    def write_summary(partial=None):
        counts = {}
        for r in results.values():
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        wall_s = round(earlier_s + time.monotonic() - started, 1)
        summary = {"backend": args.backend, "world_size": size, "torch": torch.__version__,
                   "select": args.select, "wall_s": wall_s,
                   "counts": counts, "ended_at_timeout": partial, "tests": results}
        if summary_path:
            with open(summary_path, "w") as f:
                json.dump(summary, f, indent=1, sort_keys=True)
        return counts

    def on_timeout(index, name):
        # Rank 0 writes what it knows (its own watchdog fires too: every rank armed the
        # same limit within the test's first sync), with the ranks that had not finished.
        if rank == 0:
            errors = {}
            for r in range(size):
                key = "result/%d/%d" % (index, r)
                if not store.side.check([key]):
                    errors[str(r)] = "timed out: still running after %g s" % limits(name)[1]
                elif "error" in json.loads(store.side.get(key)):
                    errors[str(r)] = json.loads(store.side.get(key))["error"]
            results[name] = {"outcome": "failed", "s": limits(name)[1], "error": errors}
            counts = write_summary(partial=name)
            print("[torch_suite] ended at %s: %s" % (name, counts), flush=True)

    watchdog = Watchdog(rank, on_timeout)

    def limits(name):
        """The test's group timeout (torch's CUSTOM_PG_TIMEOUT for the few it names) and
        how long it may run: at least --test-timeout, and long enough that its group's
        timeout fires first."""
        pg = dt.CUSTOM_PG_TIMEOUT.get(name, args.pg_timeout)
        return pg, max(args.test_timeout, pg + 30)

    def run_one(index, name):
        """One test on this rank, as a child of torch's spawn harness runs it
        (TestDistBackend._run): fresh folders and default group, barrier, the test,
        barrier, destroy. Returns {"outcome": ..., ...} for this rank."""
        method = getattr(Suite, name)
        if getattr(method, "__unittest_skip__", False):  # decided at import: the same on all ranks
            return {"outcome": "skipped", "reason": method.__unittest_skip_why__}
        test_dir = os.path.join(run_dir, "%03d" % index)
        for sub in ("barrier", "test_dir", "init_dir"):
            os.makedirs(os.path.join(test_dir, sub), exist_ok=True)
        os.environ["TEMP_DIR"] = test_dir
        dt.INIT_METHOD = "file://" + os.path.join(test_dir, "init_dir", "shared_init_file")
        dt.Barrier.barrier_id = 0  # the folder is new; a spawned child starts at 0 too
        saved_env = dict(os.environ)
        store.sync("start/%d" % index)
        case = Suite(name)
        case.rank = rank
        case.file_name = os.path.join(test_dir, "init_file")
        common_utils.set_rng_seed()
        try:
            dist.init_process_group(backend=args.backend, init_method="file://" + case.file_name,
                                    world_size=size, rank=rank,
                                    timeout=datetime.timedelta(seconds=limits(name)[0]))
            case._barrier()
            getattr(case, name)()
            case._barrier()
            outcome = {"outcome": "passed"}
        except unittest.SkipTest as e:
            outcome = {"outcome": "skipped", "reason": str(e)}
        except SystemExit as e:  # the harness's skips: sys.exit(TEST_SKIPS[...].exit_code)
            if e.code in skip_codes:
                outcome = {"outcome": "skipped", "reason": skip_codes[e.code]}
            else:
                outcome = {"outcome": "failed", "error": "SystemExit(%r)" % (e.code,)}
        except Exception as e:
            outcome = {"outcome": "failed", "error": first_lines(e)}
        finally:
            # Undo what a test leaves in this process, which a spawned child would take
            # with it: the groups, the environment.
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception as e:
                print("[torch_suite] rank %d: destroy_process_group after %s: %s"
                      % (rank, name, e), file=sys.stderr, flush=True)
            os.environ.clear()
            os.environ.update(saved_env)
        return outcome

    todo = [(i, n) for i, n in enumerate(names) if n not in results]
    if rank == 0:
        print("[torch_suite] %s, %d ranks, torch %s: %d tests (%d to run)"
              % (args.backend, size, torch.__version__, len(names), len(todo)), flush=True)
    for index, name in todo:
        t0 = time.monotonic()
        watchdog.arm(index, name, limits(name)[1])
        mine = run_one(index, name)
        mine["s"] = round(time.monotonic() - t0, 2)
        store.store.set("result/%d/%d" % (index, rank), json.dumps(mine))
        store.sync("end/%d" % index, limits(name)[1] + 60)
        watchdog.disarm()
        if rank != 0:
            continue
        per_rank = [json.loads(store.store.get("result/%d/%d" % (index, r))) for r in range(size)]
        failed = {str(r): o["error"] for r, o in enumerate(per_rank) if o["outcome"] == "failed"}
        skipped = [o["reason"] for o in per_rank if o["outcome"] == "skipped"]
        seconds = max(o["s"] for o in per_rank)
        if failed:
            merged = {"outcome": "failed", "error": failed}
        elif skipped:
            merged = {"outcome": "skipped", "reason": skipped[0]}
        else:
            merged = {"outcome": "passed"}
        merged["s"] = seconds
        results[name] = merged
        note = ""
        if failed:
            note = " | " + next(iter(failed.values())).splitlines()[0][:150]
        elif skipped and len(skipped) < size:
            note = " (skipped on %d of %d ranks)" % (len(skipped), size)
        print("[%3d/%d] %-60s %-7s %5.1fs%s" % (index + 1, len(names), name, merged["outcome"],
                                                 seconds, note), flush=True)

    store.sync("done")
    if rank == 0:
        counts = write_summary()
        print("[torch_suite] %s, %d ranks: %s; %.0f s" % (args.backend, size, json.dumps(counts),
                                                         time.monotonic() - started), flush=True)
    if args.backend == "perseus":
        import perseus.torch.horovod as hvd
        hvd.shutdown()  # leave the MPI job as Perseus expects, not "exited without shutdown()"
    # The harness store's server is rank 0's: it leaves last.
    if rank == 0:
        deadline = time.monotonic() + 30
        while store.store.add("left", 0) < size - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        store.store.add("left", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
