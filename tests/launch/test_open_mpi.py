"""Perseus on a second MPI: Debian's Open MPI (issue 32, point 4). Everything else
runs on the venv's MPICH; this module builds a copy of the core with Open MPI's
mpicxx and runs the two things that differ most between the two:

- a plain `python` (no mpirun) is an Open MPI singleton, whose start forks inside
  MPI_Init_thread: init() used to deadlock there in Perseus's fork handler;
- `mpirun -np 2` of Open MPI runs a collective script (tests/rank_scripts/allreduce.py).

The build (about a minute on 2 cores) is cached in ~/.cache/perseus/open_mpi_core/
(build_support/other_mpi_core.py). The copy runs from a package folder of its own on
PYTHONPATH: this checkout's Python files with the Open MPI core in lib/. Skipped, saying so, where Open MPI is not
installed (`apt-get install libopenmpi-dev openmpi-bin`; scripts/setup.sh does it).
"""
import os
import shutil
import sys

import pytest

from support.jobs import clean_env, run_bounded
from support.jobs import BUILD_SUPPORT  # noqa: F401 - puts build_support/ on sys.path
from other_mpi_core import build_core, package

pytestmark = pytest.mark.timeout(600)


def _open_mpi():
    found = {tool: shutil.which(tool + ".openmpi") for tool in ("mpicxx", "mpirun")}
    missing = [tool + ".openmpi" for tool, path in found.items() if path is None]
    if missing:
        pytest.skip("Open MPI is not installed (%s not on PATH): apt-get install "
                    "libopenmpi-dev openmpi-bin (scripts/setup.sh does)" % ", ".join(missing))
    return found["mpicxx"], found["mpirun"]


@pytest.fixture(scope="module")
def open_mpi(tmp_path_factory):
    """{"mpirun": Open MPI's mpirun, "pythonpath": a folder holding a `perseus` package
    whose core is the Open MPI build}."""
    mpicxx, mpirun = _open_mpi()
    core = build_core("open_mpi_core", mpicxx)
    return {"mpirun": mpirun, "pythonpath": package(core, tmp_path_factory.mktemp("open_mpi"))}


# -P: no current folder on sys.path, so `perseus` comes from PYTHONPATH, not this checkout.
PLAIN_INIT = """
import perseus.torch.horovod as hvd
from perseus.common import library
hvd.init()
print(library.LIBRARY_PATH)
print(library.mpi_library_version())
print(hvd.size())
hvd.shutdown()
"""


def test_plain_python_init_is_a_world_of_one(open_mpi):
    env = clean_env({"PYTHONPATH": open_mpi["pythonpath"]})
    for attempt in range(3):  # the deadlock hung 5 of 5 tries here
        rc, out, err, seconds = run_bounded([sys.executable, "-P", "-c", PLAIN_INIT], env, 60)
        report = "try %d: rc %d after %.1f s\nstdout:\n%s\nstderr:\n%s" % (
            attempt, rc, seconds, out, err)
        assert rc == 0, report
        path, version, size = out.strip().split("\n")[-3:]
        assert path == os.path.join(open_mpi["pythonpath"], "perseus", "lib", "libperseus.so")
        assert version.startswith("Open MPI v"), report
        assert size == "1", report


def test_mpirun_np2_runs_a_collective_script(open_mpi, run_mpi):
    # The venv's MPICH build would abort here: MPICH cannot start under Open MPI's
    # launcher (PMIx), so a pass means the Open MPI build ran. Open MPI refuses root
    # and more ranks than cores unless told, and wants an rsh agent that exists even
    # for a launch on one host, where it is never called (machines without ssh).
    launcher = [open_mpi["mpirun"], "--allow-run-as-root", "--oversubscribe",
                "--mca", "plm_rsh_agent", "false", "-x", "PYTHONPATH"]
    out = run_mpi("allreduce", 2, env={"PYTHONPATH": open_mpi["pythonpath"]},
                  launcher=launcher, timeout=240)
    # Each rank's last line is "[rank N] ok"; Open MPI passes on every write as it
    # comes (print() makes several), so the two lines may interleave.
    assert out.count("ok") == 2 and out.count("[rank ") == 2, out
