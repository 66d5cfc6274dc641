"""Builds the C++ unit tests of tests/cpp/ against csrc/src with the venv's MPI compiler."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, TESTS_DIR


def find_mpi_compiler(name):
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.skip("%s not found next to %s nor on PATH" % (name, sys.executable))
    return found


def build_cpp_test(folder, test, sources, optimize="-O0"):
    """Compiles tests/cpp/<test>.cc with the given csrc/src sources into folder; returns
    the binary's path."""
    binary = Path(folder) / test
    src = REPO_ROOT / "csrc" / "src"
    subprocess.run([find_mpi_compiler("mpicxx"), "-std=c++17", optimize,
                    "-I%s" % (REPO_ROOT / "csrc" / "include"), "-I%s" % src,
                    str(TESTS_DIR / "cpp" / (test + ".cc"))]
                   + [str(src / p) for p in sources] + ["-o", str(binary)], check=True)
    return binary
