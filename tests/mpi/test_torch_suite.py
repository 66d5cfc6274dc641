"""PyTorch's own distributed test suite (DistributedTest._DistTestBase, torch 2.13) against
the "perseus" backend, at np 2 (issue 48, part 2), through tests/torch_suite/.

Two runs: under its own name (no test may fail), then, with the suite's name checks
shown "gloo" (--gloo-name-checks), the tests gloo passes that the first run did not:
those torch keys on gloo's name (timeouts, sparse all_reduce, monitored_barrier, the
coalesced all_reduces, get_future).
Every test that gloo passes on this machine (tests/torch_suite/gloo_passes.txt) must pass
in one of them, except those in KNOWN, each with its reason (docs/ddp.md lists them).
"""
import json
import sys

import pytest

from support.jobs import REPO_ROOT, clean_env, find_mpirun, run_bounded

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(400)]

SUITE = REPO_ROOT / "tests" / "torch_suite"
# Tests gloo passes that perseus cannot be shown to pass here, and why.
KNOWN = {
    name: "skipped for perseus ('get_future is only supported on mpi, nccl and gloo'); "
          "under gloo's name the test builds its model only for gloo or mpi"
    for name in ("test_accumulate_gradients_no_sync",
                 "test_accumulate_gradients_no_sync_allreduce_hook",
                 "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
                 "test_accumulate_gradients_no_sync_grad_is_view")
}


def run_suite(tmp_path, name, *flags):
    pytest.importorskip("expecttest", reason="torch's test modules need expecttest")
    out = tmp_path / (name + ".json")
    cmd = [find_mpirun(), "-np", "2", sys.executable, SUITE / "run_distributed_test.py",
           "--backend", "perseus", "--json", out, "--port", "29417"] + list(flags)
    rc, stdout, stderr, _ = run_bounded(cmd, clean_env(), 300)
    report = "rc %d\nstdout (end):\n%s\nstderr (end):\n%s" % (rc, stdout[-6000:], stderr[-4000:])
    assert rc == 0 and out.exists(), report
    return json.loads(out.read_text())["tests"], report


def test_what_gloo_passes_passes_on_perseus(tmp_path):
    own, own_report = run_suite(tmp_path, "own_name")
    failed = {n: t for n, t in own.items() if t["outcome"] == "failed"}
    assert not failed, "failed under perseus's own name: %s\n%s" % (failed, own_report)
    gloo_passes = [line.strip() for line in (SUITE / "gloo_passes.txt").read_text().splitlines()
                   if line.strip() and not line.startswith("#")]
    # Shown "gloo", only what gloo passes and the name "perseus" did not (a second full
    # run would cost half a minute more for the same answers).
    again = sorted(n for n in gloo_passes if own.get(n, {}).get("outcome") != "passed")
    as_gloo = {}
    if again:
        as_gloo, _ = run_suite(tmp_path, "gloo_name", "--gloo-name-checks",
                               "--select", "^(%s)$" % "|".join(again))
    missing = [n for n in gloo_passes if n not in KNOWN and
               own.get(n, {}).get("outcome") != "passed" and
               as_gloo.get(n, {}).get("outcome") != "passed"]
    assert not missing, "gloo passes, perseus does not: %s" % {
        n: (own.get(n), as_gloo.get(n)) for n in missing}
    passed_own = sum(t["outcome"] == "passed" for t in own.values())
    print("perseus, own name: %d passed; %d of gloo's %d pass in either run"
          % (passed_own, len(gloo_passes) - len(missing) - len(KNOWN), len(gloo_passes)))
