"""`bash scripts/setup.sh` run again with nothing changed takes seconds (issue 49,
point 8): its `pip install -e .` no longer recompiles the core. pip builds an editable
install through setuptools' build_editable hook, in fresh temporary folders, so every
rerun compiled the core from scratch (245 s on a loaded machine); setup.py now keeps
the editable build in build/editable/. Here setup.py and build_support/ as they are,
around a one-file core, through the hook pip calls (about a second a build)."""
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

MINI_CORE = """#include <mpi.h>
extern "C" int perseus_mini(char* text, int* length) { return MPI_Get_library_version(text, length); }
"""
BUILD_EDITABLE = "import sys; from setuptools import build_meta; build_meta.build_editable(sys.argv[1])"


def _venv_mpicxx():
    mpicxx = os.path.join(os.path.dirname(sys.executable), "mpicxx")
    if not os.access(mpicxx, os.X_OK):
        pytest.fail("no mpicxx next to %s: run scripts/setup.sh" % sys.executable)
    return mpicxx


def test_an_editable_rebuild_with_nothing_changed_compiles_nothing(tmp_path):
    tree = tmp_path / "tree"
    (tree / "csrc" / "include").mkdir(parents=True)
    (tree / "csrc" / "src").mkdir()
    (tree / "perseus" / "lib").mkdir(parents=True)
    for init in ("perseus/__init__.py", "perseus/lib/__init__.py"):
        (tree / init).write_text("")
    (tree / "csrc" / "src" / "core.cc").write_text(MINI_CORE)
    os.symlink(REPO_ROOT / "build_support", tree / "build_support")
    (tree / "setup.py").write_text((REPO_ROOT / "setup.py").read_text())
    core = tree / "perseus" / "lib" / "libperseus.so"

    def build():
        """-> the in-place core's mtime after an editable build, as `pip install -e .`."""
        res = subprocess.run([sys.executable, "-c", BUILD_EDITABLE, str(tmp_path / "dist")],
                             cwd=str(tree), env=dict(os.environ, PERSEUS_MPICXX=_venv_mpicxx()),
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        return core.stat().st_mtime_ns

    first = build()
    assert build() == first  # nothing changed: the core was neither compiled nor linked
    os.utime(tree / "csrc" / "src" / "core.cc")
    assert build() != first  # a changed source is compiled
