"""scripts/setup.sh on a user's machine (issue 49, point 8): a rerun with nothing
changed takes seconds, a long step shows that it is alive, and the shared Caffe
build's lock says what it waits for.

- `pip install -e .` (setup.sh's core step) no longer recompiles the core. pip builds
  an editable install through setuptools' build_editable hook, in fresh temporary
  folders, so every rerun compiled the core from scratch (245 s on a loaded machine);
  setup.py now keeps the editable build in build/editable/. Here setup.py and
  build_support/ as they are, around a one-file core, through the hook pip calls
  (about a second a build).
- setup.sh's steps (scripts/setup_steps.sh) print a line every SETUP_TICK_S seconds
  (30 by default) with the step's progress: the TensorFlow step printed nothing for
  minutes.
- Steps that need nothing from each other run side by side and print their output
  in order once all have ended; one that fails fails the setup.
- patches/bvlc_caffe/build.sh, finding another build holding the cache's lock, names
  the holder instead of waiting without a word."""
import fcntl
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from support.jobs import REPO_ROOT

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
    (tree / "perseus" / "__init__.py").write_text('__version__ = "0.0.0"\n')  # setup.py reads it
    (tree / "perseus" / "lib" / "__init__.py").write_text("")
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


def _steps(script, tick_s):
    """bash -c 'source scripts/setup_steps.sh; <script>' -> (exit code, output, seconds)."""
    started = time.monotonic()
    res = subprocess.run(["bash", "-c", "set -euo pipefail; source scripts/setup_steps.sh; "
                          + script], cwd=str(REPO_ROOT), env=dict(os.environ, SETUP_TICK_S=str(tick_s)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    return res.returncode, res.stdout, time.monotonic() - started


def test_a_long_step_says_it_is_alive_and_how_far_it_got():
    code, out, _ = _steps('counted() { echo "7 of 9 things"; }; '
                          'PROGRESS=counted step "waiting on purpose" "3 s" sleep 3.5', 1)
    assert code == 0, out
    assert out.startswith("[setup] waiting on purpose (first time about 3 s) ...\n"), out
    ticks = re.findall(r"^\[setup\]   \.\.\. \d+s so far, 7 of 9 things$",
                       out, re.M)
    assert len(ticks) >= 2, out
    assert re.search(r"^\[setup\]   done in \d+s$", out, re.M), out


def test_a_step_ends_with_its_command_and_keeps_its_failure():
    # A tick's sleep outlives the step: it must not hold the output pipe open.
    code, out, seconds = _steps('step "quick" "1 s" true', 20)
    assert code == 0 and "done in" in out and seconds < 10, (seconds, out)
    code, out, _ = _steps('step "failing on purpose" "1 s" false; echo after', 20)
    assert code != 0 and "failed after" in out and "after\n" not in out, out


def test_steps_side_by_side_run_together_and_report_in_order():
    # The framework venvs and Caffe are made side by side (about 140 s less setup).
    code, out, seconds = _steps('in_background step "slow" "2 s" sleep 2; '
                                'in_background step "quick" "1 s" true; '
                                'in_background step "third" "2 s" sleep 2; finish_background; echo after', 20)
    assert code == 0 and seconds < 3.9, (seconds, out)  # one after another: over 4 s
    assert out.index("[setup] slow") < out.index("[setup] quick") < out.index("[setup] third"), out
    assert out.endswith("after\n"), out
    code, out, _ = _steps('in_background step "failing on purpose" "1 s" false; '
                          'in_background step "fine" "1 s" true; finish_background; echo after', 20)
    assert code != 0 and "failed after" in out and "[setup]   done in" in out, out
    assert "after\n" not in out, out


def test_the_caffe_cache_lock_says_what_it_waits_for(tmp_path):
    cache = tmp_path / "caffe"
    lock = tmp_path / "caffe.lock"
    with open(lock, "w+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        holder.write("pid 4242 (a test holding the lock)")
        holder.flush()
        proc = subprocess.Popen(["bash", str(REPO_ROOT / "patches" / "bvlc_caffe" / "build.sh")],
                                env=dict(os.environ, PERSEUS_CAFFE_CACHE=str(cache)),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            said = b""
            deadline = time.monotonic() + 20
            while b"\n" not in said and time.monotonic() < deadline:
                if select.select([proc.stderr], [], [], 0.5)[0]:
                    chunk = os.read(proc.stderr.fileno(), 4096)
                    if not chunk:
                        break
                    said += chunk
            assert proc.poll() is None, said  # still waiting for the lock
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = said.decode()
    assert "waiting for another build of this Caffe" in said, said
    assert "pid 4242 (a test holding the lock) holds %s" % lock in said, said
