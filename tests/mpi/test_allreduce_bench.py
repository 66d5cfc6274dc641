"""benchmarks/allreduce_bench.py runs end to end at np=2 on a small configuration and
draws its figure (--plot): docs/performance.md shows one made this way."""
import re
import sys

import pytest

from support.jobs import REPO_ROOT, run_job

pytestmark = pytest.mark.mpi


def test_small_run_prints_every_baseline_and_plots(tmp_path):
    png = tmp_path / "allreduce.png"
    out = run_job(2, [sys.executable, REPO_ROOT / "benchmarks" / "allreduce_bench.py",
                      "--sizes", "4K", "64K", "--iters", "20", "--no-idle", "--idle-watch", "0",
                      "--plot", png], timeout=240)
    # Every measurement's row, with a median time, for Perseus and both baselines.
    for name in ("perseus.allreduce_.4096", "mpi4py.interleaved.4096", "mpi4py.floor.65536",
                 "gloo.allreduce.65536", "perseus.resnet50.async", "gloo.resnet50.async"):
        assert re.search(r"^\| %s \| [^|]+ \| [^|]+ \| [\d.]+ (µs|ms) \|" % re.escape(name), out, re.M), (name, out)
    assert "wrote %s" % png in out, out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
