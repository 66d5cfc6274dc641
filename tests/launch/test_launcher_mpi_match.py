"""The wrong mpirun (issue 49, point 4): a launcher of another MPI than the core's is
refused, naming the core's MPI and the launcher to use, by perseusrun before it starts
anything, and by init() in each rank before MPI_Init (where MPICH, started by a PMIx
launcher such as Open MPI's mpirun, would abort with "unsupported PMI version PMIx")."""
import os
import shutil
import subprocess
import sys

import pytest

from support.jobs import REPO_ROOT, clean_env
from perseus import launcher

PERSEUSRUN = REPO_ROOT / "bin" / "perseusrun"
VENV_MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
INIT = ("from perseus.common import basics\n"
        "try:\n    basics.init()\n"
        "except Exception as e:\n    print('ERROR %s: %s' % (type(e).__name__, e), flush=True)\n"
        "else:\n    print('SIZE', basics.size(), flush=True)\n")


def core_mpi():
    from perseus.common import library
    return library.mpi_header_version()


def require_an_mpich_core():
    if not core_mpi().startswith("MPICH"):
        pytest.skip("these cases are for a core built with MPICH (this one: %s)" % core_mpi())


def test_init_refuses_a_pmix_launch_before_mpi_init(run_python):
    """The variables a PMIx launcher (Open MPI's mpirun) sets, without the launcher:
    MPICH without PMIx aborted inside MPI_Init, printing its own error stack."""
    require_an_mpich_core()
    res = run_python(INIT, env={"PMIX_NAMESPACE": "prterun-x-1@1", "PMIX_RANK": "0",
                                "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"})
    out = res.stdout + res.stderr
    assert "ERROR HorovodInternalError" in res.stdout, out
    assert "Open MPI's mpirun (OMPI_COMM_WORLD_SIZE=2) started this process" in out, out
    assert "Perseus was built with %s" % core_mpi() in out, out
    assert "%s -np N" % VENV_MPIRUN in out and "perseusrun -np N" in out, out
    assert "internal_Init_thread" not in out, out  # MPICH's own abort


def test_hydra_ranks_and_a_plain_python_are_not_refused(run_python):
    res = run_python(INIT)
    assert "SIZE 1" in res.stdout, res.stdout + res.stderr


@pytest.mark.timeout(120)
def test_open_mpis_mpirun_with_an_mpich_core():
    """Debian's Open MPI mpirun launching this (MPICH) core: each rank says why."""
    require_an_mpich_core()
    mpirun = shutil.which("mpirun.openmpi")
    if mpirun is None:
        pytest.skip("Open MPI is not installed (apt-get install openmpi-bin)")
    res = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                          sys.executable, "-c", INIT], cwd=str(REPO_ROOT), env=clean_env(),
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=100)
    out = res.stdout + res.stderr
    assert res.stdout.count("ERROR HorovodInternalError") == 2, out
    assert "Perseus was built with %s" % core_mpi() in out and "perseusrun" in out, out
    assert "internal_Init_thread" not in out, out  # MPICH's own abort


def fake_mpirun(folder, version_text):
    path = folder / "mpirun"
    path.write_text("#!/bin/sh\necho '%s'\n" % version_text)
    path.chmod(0o755)
    return str(path)


def perseusrun(args):
    return subprocess.run([sys.executable, str(PERSEUSRUN)] + args, cwd=str(REPO_ROOT),
                          env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)


def test_perseusrun_refuses_an_mpirun_of_another_mpi(tmp_path):
    require_an_mpich_core()
    other = fake_mpirun(tmp_path, "mpirun (Open MPI) 4.1.4")
    res = perseusrun(["--mpirun", other, "--dry-run", "-np", "2", "python", "t.py"])
    assert res.returncode == 2, res.stdout + res.stderr
    err = res.stderr
    assert "%s is Open MPI's mpirun" % other in err, err
    assert "was built with %s" % core_mpi() in err, err
    assert "--mpirun %s" % VENV_MPIRUN in err or VENV_MPIRUN in err, err
    # A flavour given by hand is compared the same way.
    res = perseusrun(["--mpi-flavour", "openmpi", "--dry-run", "-np", "2", "python"])
    assert res.returncode == 2 and "built with %s" % core_mpi() in res.stderr, res.stderr


def test_perseusrun_takes_an_mpirun_of_the_cores_mpi(tmp_path):
    require_an_mpich_core()
    same = fake_mpirun(tmp_path, "HYDRA build details:\n    Version: 4.2.0")
    res = perseusrun(["--mpirun", same, "--dry-run", "-np", "2", "python", "t.py"])
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("header, flavour, same", [
    ("MPICH 5.0.2", launcher.MPICH, True), ("Intel MPI 2021.9", launcher.MPICH, True),
    ("MVAPICH2 2.3", launcher.MPICH, True), ("Open MPI 4.1.4", launcher.OPENMPI, True),
    ("MPICH 5.0.2", launcher.OPENMPI, False), ("Open MPI 5.0.3", launcher.MPICH, False),
    ("an MPI of unknown kind (MPI 3.1)", launcher.MPICH, True),  # unknown: not refused
])
def test_flavour_of_the_core(header, flavour, same):
    from perseus import launcher_mpi_match
    assert launcher_mpi_match.compatible(header, flavour) == same


def bare_mpirun_commands():
    """Commands a user would paste that start another program with a bare `mpirun`
    (the first on PATH, perhaps another MPI's): from the README, the docs site,
    benchmarks/README.md and the usage lines of the benchmarks' docstrings."""
    import ast
    from support.doc_text import commands_in, simple_commands, user_pages, words
    found = []
    pages = user_pages() + [REPO_ROOT / "benchmarks" / "README.md"]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        lines = commands_in(text) + [l.strip() for l in text.splitlines() if l.startswith("    ")]
        for line in lines:  # ```sh blocks, inline spans, and indented code blocks
            found += [(page, c) for c in simple_commands(line)]
    for script in sorted((REPO_ROOT / "benchmarks").glob("*.py")):
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
        found += [(script, line.strip()) for line in doc.splitlines()
                  if line.startswith(" ") and line.strip()]
    bare = []
    for where, command in found:
        tokens = words(command)
        if tokens[:1] == ["mpirun"] and len(tokens) > 3:  # `mpirun -np N` alone is prose
            bare.append("%s: %s" % (where.relative_to(REPO_ROOT), command))
    return bare


def test_commands_name_the_cores_launcher():
    """`.venv/bin/mpirun` or `perseusrun`, never the first mpirun on PATH (on Debian, Open
    MPI's, which an MPICH-built core cannot use)."""
    bare = bare_mpirun_commands()
    assert not bare, "\n".join(bare)
