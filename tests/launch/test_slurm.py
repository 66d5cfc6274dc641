"""Slurm (issue 39, points 3 and 4): a one-node cluster of Debian's slurmctld, slurmd
and munged (tests/support/slurm_cluster.py: CPUs=2, its own configuration, state and munge key
in a temporary folder, started on hostA of the namespace hosts, stopped at the end).

- `srun -n 2 --mpi=pmi2` runs the collective tests and the main job (./train.sh) with
  the mpich wheel; an sbatch script runs a plain `python` (a world of 1, no error),
  `srun --mpi=pmi2` and perseusrun inside its allocation.
- Debian's Open MPI under `srun --mpi=pmix`.
- Open MPI 5 with ULFM (pip's wheel, .venv-ompi5) under `srun -K0 --mpi=pmix` with ULFM
  on: a task that dies takes the whole step with it (Slurm's PMIx plugin kills it), and
  hvd.elastic.run's mode line says so instead of promising a shrink
  (docs/investigations/slurm-ulfm.md).
- Processes a launcher started without MPI joining them: `srun -n 2 --mpi=none` (MPICH
  comes up alone in each task) and MPICH's mpiexec starting the Open MPI build: init()
  raises on every task, naming the variable it read, what MPI said and the fix.
  (Combinations MPI itself refuses, e.g. Open MPI under `--mpi=pmi2` or `none`, and
  MPICH under `--mpi=pmix`, abort in MPI_Init with MPI's own message: docs/install.md, "On a
  Slurm cluster".)

Not root: skipped (under CI=true, failed). Root without Slurm: failed, since
scripts/setup.sh --all installs it (PERSEUS_SKIP_SLURM=1 skips these on purpose).
"""
import os
import re
import sys
from pathlib import Path

import pytest

from support import fake_hosts
from support import slurm_cluster
from support.jobs import RANK_SCRIPTS, REPO_ROOT, clean_env, find_mpirun, framework_python
from support.jobs import run_bounded
from support.jobs import BUILD_SUPPORT  # noqa: F401 - puts build_support/ on sys.path
from other_mpi_core import build_core, package
from test_open_mpi import open_mpi  # noqa: F401 - a fixture: the core built with Open MPI

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

VENV_BIN = Path(sys.executable).parent

# init(), then this task's rank and size, or the error init() raised, on one line
# (the framework-neutral API: no framework to import).
INIT = """
import os
from perseus.common import basics as hvd
task = os.environ.get("PMI_RANK", os.environ.get("SLURM_PROCID", "-"))
try:
    hvd.init()
except Exception as e:
    print("TASK %s %s: %s" % (task, type(e).__name__, e), flush=True)
    raise SystemExit(5)
print("TASK %s rank %d of %d, local %d" % (task, hvd.rank(), hvd.size(), hvd.local_rank()), flush=True)
hvd.shutdown()
"""


@pytest.fixture(scope="module")
def slurm(hosts, tmp_path_factory):
    if os.environ.get("PERSEUS_SKIP_SLURM") == "1":
        pytest.skip("PERSEUS_SKIP_SLURM=1: Slurm tests skipped on purpose")
    missing = slurm_cluster.unavailable_reason()
    if missing:
        pytest.fail(missing, pytrace=False)
    with slurm_cluster.SlurmCluster(hosts, "hostA", tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def user_env(extra=None):
    """A user's shell on the node: the venv on PATH, this checkout on PYTHONPATH."""
    env = {"PATH": "%s:%s" % (VENV_BIN, fake_hosts.LOGIN_PATH), "PYTHONPATH": str(REPO_ROOT),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.update(extra or {})
    return env


def on_node(slurm, argv, env=None, timeout=180):
    rc, out, err, seconds = run_bounded(slurm.command(argv, user_env(env), cwd=REPO_ROOT),
                                        os.environ, timeout)
    report = "%s: rc %d after %.1f s\n----- stdout -----\n%s\n----- stderr -----\n%s" % (
        " ".join(map(str, argv)), rc, seconds, out, err[-8000:])
    return rc, out, report


def test_srun_pmi2_runs_the_collectives(slurm, tmp_path):
    rc, out, report = on_node(slurm, ["srun", "-n", "2", "--mpi=pmi2", "python",
                                      RANK_SCRIPTS / "multi_host.py"],
                              {"PTEST_HOSTS": "1", "PTEST_PARTS": "collectives",
                               "PTEST_TMPDIR": str(tmp_path)})
    assert rc == 0 and out.count(" ok") == 2, report
    assert len(set(re.findall(r"DIGEST (\d) collectives", out))) == 2, report


def test_srun_pmi2_runs_the_main_job(slurm):
    rc, out, report = on_node(slurm, ["srun", "-n", "2", "--mpi=pmi2", "./train.sh"],
                              {"EPOCHS": "2", "CHECKPOINT": ""})
    assert rc == 0, report
    accuracy = re.search(r"Final test accuracy: ([\d.]+)% on 2 rank\(s\)", out)
    assert accuracy and float(accuracy.group(1)) > 80, report


def test_srun_without_pmi_fails_init_on_every_task(slurm):
    """Point 4: MPICH under `srun --mpi=none` comes up alone in each task (rank 0 of 1);
    before, that trained two independent copies."""
    rc, out, report = on_node(slurm, ["srun", "-n", "2", "--mpi=none", "python", "-c", INIT])
    assert rc != 0, report
    for task in (0, 1):
        line = re.search(r"TASK %d HorovodInternalError: (.*)" % task, out)
        assert line, report
        for text in ("srun started 2 processes (SLURM_STEP_NUM_TASKS=2, SLURM_PROCID=%d)" % task,
                     "MPI says the world has 1 rank", "MPICH", "srun --mpi=pmi2"):
            assert text in line.group(1), report


def test_sbatch_script(slurm, tmp_path):
    """An sbatch script's own shell has SLURM_NTASKS=2 and SLURM_PROCID=0 but is no
    task of a step: a plain python there is a world of 1, without an error. srun with
    --mpi=pmi2 and perseusrun inside the allocation start 2 ranks."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --ntasks=2\nset -e\n"
                      "python -c \"$INIT\"\n"
                      "srun --mpi=pmi2 python -c \"$INIT\"\n"
                      "perseusrun -np 2 python -c \"$INIT\"\n")
    output = tmp_path / "job.out"
    rc, out, report = on_node(slurm, ["sbatch", "--wait", "--output", output, script],
                              {"INIT": INIT})
    text = output.read_text() if output.exists() else "(no output file)"
    report += "\n----- job output -----\n" + text
    assert rc == 0, report
    lines = sorted(re.findall(r"TASK (\S+) rank (\d) of (\d)", text))
    assert lines == [("0", "0", "1"), ("0", "0", "2"), ("0", "0", "2"), ("1", "1", "2"),
                     ("1", "1", "2")], report


def test_open_mpi_srun_pmix(slurm, open_mpi):  # noqa: F811 - the fixture
    rc, out, report = on_node(slurm, ["srun", "-n", "2", "--mpi=pmix", "python", "-P", "-c", INIT],
                              {"PYTHONPATH": open_mpi["pythonpath"]})
    assert rc == 0, report
    assert sorted(re.findall(r"TASK (\d) rank (\d) of 2", out)) == [("0", "0"), ("1", "1")], report


# hvd.elastic.run's mode on each task, then task 1 is SIGKILLed and task 0 waits to see
# whether it outlives it.
SRUN_ULFM = """
import os, signal, time
from perseus.common import basics as hvd
from perseus.common import elastic
hvd.init()
print("TASK %d mode %s: %s" % ((hvd.rank(),) + elastic.mode()), flush=True)
if hvd.rank() == 1:
    time.sleep(2)  # task 0 is past init() and its print
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(8)
print("TASK %d outlived task 1" % hvd.rank(), flush=True)
os._exit(0)
"""


def test_open_mpi5_ulfm_under_srun_ends_the_step_and_says_so(slurm, tmp_path_factory):
    """Issue 46, point 6: the ULFM core (pip's Open MPI 5) started by `srun -K0
    --mpi=pmix` with ULFM on (OMPI_MCA_mpi_ft_enable=1; OPAL_PREFIX finds the wheel's
    ft-mpi parameter set) cannot shrink: slurmstepd's PMIx plugin kills the step when a
    task's PMIx connection is lost (PMIX_ERR_LOST_CONNECTION), -K0 notwithstanding.
    hvd.elastic.run's mode says the job ends and names the route that works (perseusrun
    --elastic inside the allocation); before, it said the failed rank is left behind."""
    python = framework_python("Open MPI 5 (ULFM)", "ompi5", "setup_ompi5.sh")
    core = build_core("open_mpi5_core", str(python.parent / "mpicxx"))
    rc, out, report = on_node(slurm, ["srun", "-n", "2", "-K0", "--mpi=pmix", python, "-P", "-c",
                                      SRUN_ULFM],
                              {"PYTHONPATH": package(core, tmp_path_factory.mktemp("ompi5")),
                               "OMPI_MCA_mpi_ft_enable": "1",
                               "OPAL_PREFIX": str(python.parent.parent)}, timeout=120)
    for task in (0, 1):
        assert ("TASK %d mode end: its MPI has ULFM, but srun started this job, and Slurm's "
                "PMIx plugin" % task) in out, report
        assert "perseusrun --elastic -np N inside the allocation" in out, report
    # Slurm's doing, not Perseus's: if this fails, Slurm no longer ends the step, and
    # shrinking under srun is worth trying again.
    assert rc != 0 and "TASK 0 outlived" not in out, report
    assert "Error handler invoked: status = -61" in report and "CANCELLED" in report, report


def test_mpich_launcher_with_the_open_mpi_build_fails_init(open_mpi):  # noqa: F811
    """Point 4 without Slurm: MPICH's mpiexec starts the Open MPI build, whose MPI
    cannot speak Hydra's PMI and comes up alone in each process."""
    env = clean_env({"PYTHONPATH": open_mpi["pythonpath"]})
    rc, out, err, _ = run_bounded([find_mpirun(), "-np", "2", sys.executable, "-P", "-c", INIT],
                                  env, 120)
    report = "rc %d\n----- stdout -----\n%s\n----- stderr -----\n%s" % (rc, out, err)
    assert rc != 0, report
    for task in (0, 1):
        line = re.search(r"TASK %d HorovodInternalError: (.*)" % task, out)
        assert line and "(PMI_SIZE=2, PMI_RANK=%d)" % task in line.group(1), report
        assert "Open MPI v4" in line.group(1) and "launch with the mpirun of the MPI" in line.group(1)


# The launcher variables init() reads, one process: each set (with MPI a world of 1)
# must fail init() naming it; an sbatch shell's variables and none at all must not.
VARIABLES = """
import os
from perseus.common import basics as hvd
# The first init() starts MPI (a singleton) under the first case's variables, which
# MPICH ignores; later ones only run Perseus's check (PMIX_RANK, say, would make MPICH
# look for a PMIx server at its start).
CASES = [
    ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3"}, "SLURM_STEP_NUM_TASKS=4, SLURM_PROCID=3"),
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, "OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_RANK=1"),
    ({"PMI_SIZE": "3", "PMI_RANK": "0"}, "PMI_SIZE=3, PMI_RANK=0"),
    ({"PMIX_SIZE": "2", "PMIX_RANK": "1"}, "PMIX_SIZE=2, PMIX_RANK=1"),
    ({"MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_RANK": "0"}, "MV2_COMM_WORLD_SIZE=2, MV2_COMM_WORLD_RANK=0"),
    # The innermost launcher decides: Hydra's one process under an srun step of 2.
    ({"PMI_SIZE": "1", "PMI_RANK": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"}, None),
    # An sbatch script's shell: SLURM_NTASKS without a step.
    ({"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_ID": "7"}, None),
    ({"SLURM_STEP_NUM_TASKS": "2"}, None),  # no SLURM_PROCID: not a task
    ({}, None),
]
for variables, named in CASES:
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        hvd.init()
    except Exception as e:
        assert named is not None, "%s: %s" % (variables, e)
        assert type(e).__name__ == "HorovodInternalError" and named in str(e), (variables, str(e))
    else:
        assert named is None, "%s: no error, size %d" % (variables, hvd.size())
        assert hvd.size() == 1
        hvd.shutdown()
    os.environ.clear()
    os.environ.update(saved)
print("CASES OK")
"""


def test_launcher_variables_against_a_world_of_one(run_python):
    """Each launcher's pair of variables, and the cases that must stay a world of 1
    (a plain python, an sbatch script's shell, an inner launcher of one process)."""
    result = run_python(VARIABLES, timeout=120)
    assert "CASES OK" in result.stdout, result.stdout + result.stderr
