"""Builds the C++ unit tests of tests/cpp/ against the core as it is built.

Each C++ test (tests/cpp/*_test.cc) is linked against an archive of the core's objects, so a
test pulls in whatever of csrc/src it uses and no test lists its link set by hand. The
objects are the ones setup.py compiled for libperseus.so (pip install -e . or
build_ext --inplace) when every source has an up-to-date one; else they are compiled
here once per session. A test's first comment lines may say how it is built:

    // build: -O2                                  flags for the test's own files
    // build-with: cuda/memory/copy_table.cc       csrc/src files compiled with them,
                                                   ahead of the archive's copies

Every test prints "ok" and exits 0 when none of its checks failed (tests/cpp/expect.h).
"""
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.jobs import REPO_ROOT, TESTS_DIR

CPP_TESTS = TESTS_DIR / "cpp"
SOURCE_ROOT = REPO_ROOT / "csrc" / "src"
INCLUDES = ["-I%s" % (REPO_ROOT / "csrc" / "include"), "-I%s" % SOURCE_ROOT]
BASE_FLAGS = ["-std=c++17"]
DEFAULT_TEST_FLAGS = ["-O0"]
# Where setup.py leaves the core's objects: pip install -e . (setup.py BuildCore), then
# python setup.py build_ext --inplace.
BUILD_FOLDERS = [REPO_ROOT / "build" / "editable" / "temp"] + \
    sorted((REPO_ROOT / "build").glob("temp.*"))


def find_mpi_compiler(name):
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.skip("%s not found next to %s nor on PATH" % (name, sys.executable))
    return found


def cpp_tests():
    """The names of every C++ test: tests/cpp/*_test.cc."""
    return sorted(p.stem for p in CPP_TESTS.glob("*_test.cc"))


def core_sources():
    return sorted(SOURCE_ROOT.rglob("*.cc"))


def _built_objects(folder):
    """The objects of every core source in setup.py's build folder, or None if one is
    missing or older than its source (a header change rebuilds the core, which is newer)."""
    objects = []
    for source in core_sources():
        obj = folder / source.relative_to(REPO_ROOT).with_suffix(".o")
        if not obj.exists() or obj.stat().st_mtime < source.stat().st_mtime:
            return None
        objects.append(obj)
    return objects


def _compile_objects(folder):
    compiler = find_mpi_compiler("mpicxx")

    def compile_one(source):
        obj = folder / source.relative_to(SOURCE_ROOT).with_suffix(".o")
        obj.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([compiler] + BASE_FLAGS + ["-O1", "-fPIC"] + INCLUDES +
                       ["-c", str(source), "-o", str(obj)], check=True)
        return obj

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return list(pool.map(compile_one, core_sources()))


def core_archive(folder):
    """folder/libcore.a: the core's objects, setup.py's if current, else compiled here."""
    objects = next((o for o in map(_built_objects, BUILD_FOLDERS) if o), None)
    if objects is None:
        objects = _compile_objects(Path(folder) / "objects")
    archive = Path(folder) / "libcore.a"
    subprocess.run(["ar", "rcs", str(archive)] + [str(o) for o in objects], check=True)
    return archive


def build_directives(test):
    """(flags, extra sources) from the test's `// build:` and `// build-with:` lines."""
    flags, sources = list(DEFAULT_TEST_FLAGS), []
    for line in (CPP_TESTS / (test + ".cc")).read_text().splitlines():
        if not line.startswith("//"):
            break
        found = re.match(r"//\s*build(-with)?:\s*(.*)$", line)
        if found and found.group(1):
            sources += found.group(2).split()
        elif found:
            flags = found.group(2).split()
    return flags, sources


def build_cpp_test(folder, test, archive):
    """Compiles and links tests/cpp/<test>.cc into folder; returns the binary's path."""
    flags, sources = build_directives(test)
    binary = Path(folder) / test
    subprocess.run([find_mpi_compiler("mpicxx")] + BASE_FLAGS + flags + INCLUDES +
                   [str(CPP_TESTS / (test + ".cc"))] + [str(SOURCE_ROOT / s) for s in sources] +
                   [str(archive), "-o", str(binary)], check=True)
    return binary
