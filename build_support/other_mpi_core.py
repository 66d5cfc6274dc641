"""A copy of the core built against another MPI than the venv's MPICH, for what runs
Perseus on it: Debian's Open MPI 4 (tests/launch/test_open_mpi.py) and pip's Open MPI 5 with
ULFM (tests/mpi/test_fault_tolerance.py, benchmarks/elastic_recovery.py).

The build (one to two minutes on 2 cores) is cached under ~/.cache/perseus/<name>/,
keyed by a hash of the core's sources and build files and the compiler wrapper, so it
is redone only when they change, and clones share it. The wrapper's path is in the key
(the library's RUNPATH names its folder), so a fresh clone with its own venv builds
again; setup.py compiles through ccache where it is installed, so that build compiles
only the sources that changed since any build on the machine (4 s instead of 300 s
for the Open MPI 5 core at one source changed, then mostly the link). package() makes a folder to put
on PYTHONPATH: this checkout's Python files, with that core in lib/.
"""
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# Outside the checkout, so that every clone on the machine shares it (the key is the
# content of the inputs, not where they are).
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "perseus"
BUILD_INPUTS = ["setup.py", "csrc", "build_support"]


def build_key(mpicxx):
    digest = hashlib.sha256()
    version = subprocess.run([mpicxx, "--showme:version"], capture_output=True, text=True)
    digest.update((os.path.realpath(mpicxx) + version.stdout + version.stderr).encode())
    for top in BUILD_INPUTS:
        root = REPO_ROOT / top
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts:
                continue
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_core(name, mpicxx):
    """libperseus.so built with `mpicxx`, from ~/.cache/perseus/<name>/ when the inputs
    match. AssertionError with the compiler's output if the build fails."""
    cache = CACHE_ROOT / name
    built = cache / build_key(mpicxx) / "libperseus.so"
    if built.exists():
        return built
    work = cache / ("build-%d" % os.getpid())
    shutil.rmtree(work, ignore_errors=True)
    res = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-temp",
                          str(work / "temp"), "--build-lib", str(work / "lib")],
                         cwd=str(REPO_ROOT), env=dict(os.environ, PERSEUS_MPICXX=mpicxx),
                         capture_output=True, text=True, timeout=540)
    assert res.returncode == 0, "the %s build failed:\n%s%s" % (name, res.stdout, res.stderr)
    built.parent.mkdir(parents=True, exist_ok=True)
    os.replace(work / "lib" / "perseus" / "lib" / "libperseus.so", built)
    for old in cache.iterdir():  # one build kept: the sources' previous states are gone
        if old != built.parent:
            shutil.rmtree(old, ignore_errors=True)
    return built


def package(core, folder):
    """A folder to put on PYTHONPATH: a `perseus` package of this checkout's Python
    files whose core is `core`."""
    shutil.copytree(REPO_ROOT / "perseus", folder / "perseus",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy2(core, folder / "perseus" / "lib" / "libperseus.so")
    return str(folder)


if __name__ == "__main__":
    # python build_support/other_mpi_core.py NAME MPICXX: builds (or takes from the cache)
    # the core, makes the package beside it and prints the folder to put on PYTHONPATH
    # (scripts/elastic_demo.sh), in build/ of this checkout.
    name, compiler = sys.argv[1], sys.argv[2]
    built = build_core(name, compiler)
    # In this checkout, not beside the shared build: another clone's run would replace
    # the files under this one's ranks (seen here: a demo's ranks failing to import).
    folder = REPO_ROOT / "build" / ("%s-python" % name)
    shutil.rmtree(folder, ignore_errors=True)  # this checkout's Python files, as they are now
    folder.parent.mkdir(exist_ok=True)
    folder.mkdir()
    print(package(built, folder))
