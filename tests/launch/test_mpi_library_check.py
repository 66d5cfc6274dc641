"""libperseus refuses an MPI library of another kind than its headers (issue 32,
point 3), at once and before any MPI call.

A mixed build (compiled with MPICH's mpi.h, linked with Open MPI's libmpi.so.40) used
to hang in init(). The venv's build is consistent, so a preloaded
MPI_Get_library_version (tests/shims/mpi_library_version.c) plays the other library:
the check reads only that answer, and refusing must not depend on which MPI really
sits underneath. tests/launch/test_build_mpi.py covers the build's side.
"""
import subprocess
import sys

import pytest

from support.jobs import REPO_ROOT, clean_env, run_bounded

from perseus.common import library

OPEN_MPI = ("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, "
            "May 26, 2022")
INTEL_MPI = "Intel(R) MPI Library 2021.10 for Linux* OS"
TIMEOUT_S = 60
AT_ONCE_S = 5  # the refusal's own cost; MPI is never started


def header_mpi():
    return library.mpi_header_version()


def test_the_venv_build_passes_and_names_its_headers():
    assert header_mpi().startswith("MPICH "), header_mpi()
    assert library.check_mpi_library() is None
    # The version of the header is the version of the library (the mpich wheel's).
    assert library.mpi_library_version() == "MPICH Version: %s" % header_mpi().split()[1]


def _env(shim, version):
    return clean_env({"LD_PRELOAD": shim("mpi_library_version"),
                      "PTEST_MPI_LIBRARY_VERSION": version})


# init() refuses before touching MPI: MPI_Initialized still says 0 afterwards.
INIT = """
import ctypes, time
import perseus.torch.horovod as hvd
start = time.monotonic()
try:
    hvd.init()
    print("INIT ok")
except Exception as e:
    print("INIT %s: %s" % (type(e).__name__, e))
print("SECONDS %.2f" % (time.monotonic() - start))
flag = ctypes.c_int(-1)
ctypes.CDLL(None).MPI_Initialized(ctypes.byref(flag))
print("MPI_INITIALIZED", flag.value, "PERSEUS", int(hvd.is_initialized()))
"""


def _lines(out):
    return dict(line.split(" ", 1) for line in out.strip().split("\n"))


def test_init_refuses_an_open_mpi_library_at_once(shim):
    rc, out, err, _ = run_bounded([sys.executable, "-c", INIT], _env(shim, OPEN_MPI), TIMEOUT_S)
    report = "rc %d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err)
    assert rc == 0, report
    lines = _lines(out)
    assert lines["INIT"].startswith("HorovodInternalError: libperseus was compiled with the "
                                    "mpi.h of %s, but the MPI library loaded in this process "
                                    "is %s (" % (header_mpi(), OPEN_MPI)), report
    assert "PERSEUS_MPICXX=" in lines["INIT"], report
    assert float(lines["SECONDS"]) < AT_ONCE_S, report
    assert lines["MPI_INITIALIZED"] == "0 PERSEUS 0", report


def test_init_accepts_a_library_of_the_mpich_abi(shim):
    """Intel MPI implements MPICH's ABI: a build with MPICH's header runs on it (the
    MPI underneath is the real MPICH, so init() succeeds)."""
    rc, out, err, _ = run_bounded([sys.executable, "-c", INIT], _env(shim, INTEL_MPI), TIMEOUT_S)
    report = "rc %d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err)
    assert rc == 0, report
    lines = _lines(out)
    assert lines["INIT"] == "ok", report
    assert lines["MPI_INITIALIZED"] == "1 PERSEUS 1", report


CHECK_THEN_MPI4PY = """
from perseus.common import exceptions, library
try:
    library.check_mpi_library()
    print("CHECK ok")
except exceptions.HorovodInternalError as e:
    print("CHECK", e)
from mpi4py import MPI  # initialises MPI, as an application may before hvd.init()
import perseus.torch.horovod as hvd
try:
    hvd.init()
    print("INIT ok")
except exceptions.HorovodInternalError as e:
    print("INIT", e)
"""


def test_check_mpi_library_and_init_after_mpi4py(shim):
    pytest.importorskip("mpi4py")
    rc, out, err, _ = run_bounded([sys.executable, "-c", CHECK_THEN_MPI4PY],
                                  _env(shim, OPEN_MPI), TIMEOUT_S)
    report = "rc %d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err)
    assert rc == 0, report
    lines = _lines(out)
    for key in ("CHECK", "INIT"):
        assert lines[key].startswith("libperseus was compiled with the mpi.h of %s, but the "
                                     "MPI library loaded in this process is %s" %
                                     (header_mpi(), OPEN_MPI)), report


def test_check_build_fails_on_a_mixed_build(shim):
    cmd = [sys.executable, str(REPO_ROOT / "bin" / "perseusrun"), "--check-build"]
    mixed = subprocess.run(cmd, cwd=str(REPO_ROOT), env=_env(shim, OPEN_MPI),
                           capture_output=True, text=True, timeout=TIMEOUT_S)
    assert mixed.returncode == 1, mixed.stdout + mixed.stderr
    details = mixed.stdout.split("Details:\n", 1)[1]
    assert "MPI headers:     %s\n" % header_mpi() in details, details
    assert "MPI library:     %s\n" % OPEN_MPI in details, details
    assert "MPI check:       FAIL: libperseus was compiled with the mpi.h of" in details, details
    clean = subprocess.run(cmd, cwd=str(REPO_ROOT), env=clean_env(), capture_output=True,
                           text=True, timeout=TIMEOUT_S)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "MPI check:       ok" in clean.stdout, clean.stdout

