"""Builds Perseus: the framework-neutral core library (csrc/) and the Python package.

The core is compiled with the MPI C++ wrapper found as $PERSEUS_MPICXX, else
`mpicxx` next to this Python (e.g. from `pip install mpich`), else `mpicxx` on
PATH. To build against a system MPI, put its bin/ first on PATH or set
PERSEUS_MPICXX=/path/to/mpicxx. Nothing from PyTorch, TensorFlow, MXNet or CUDA
is needed at build time.
"""
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "src").rglob("*.cc"))

MISSING_MPI = """
Perseus needs an MPI installation with its C++ compiler wrapper (mpicxx) to build.
Install one, then build again, for example:
    pip install mpich mpi4py        # MPICH from PyPI, no root needed
or point the build at a system MPI:
    PERSEUS_MPICXX=/usr/bin/mpicxx pip install .
(With pip's build isolation, run pip from the environment that has mpicxx.)
"""


def find_mpicxx():
    candidates = [os.environ.get("PERSEUS_MPICXX"),
                  str(Path(sys.executable).parent / "mpicxx"),
                  shutil.which("mpicxx"), shutil.which("mpic++")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    return None


class BuildCore(build_ext):
    """Compiles libperseus.so with mpicxx; it is a plain shared library loaded by ctypes."""

    def get_ext_filename(self, ext_name):
        return os.path.join(*ext_name.split(".")) + ".so"

    def build_extensions(self):
        mpicxx = find_mpicxx()
        if mpicxx is None:
            sys.exit(MISSING_MPI)
        # Newer setuptools keep separate C++ commands (compiler_so_cxx, linker_so_cxx)
        # that would otherwise stay $CXX without MPI's flags: set every one there is.
        for name in ("compiler_so", "compiler_so_cxx", "compiler_cxx"):
            if name in self.compiler.executables:
                self.compiler.set_executable(name, [mpicxx])
        for name in ("linker_so", "linker_so_cxx"):
            if name in self.compiler.executables:
                self.compiler.set_executable(name, [mpicxx, "-shared"])
        super().build_extensions()


core = Extension(
    "perseus.lib.libperseus",
    sources=SOURCES,
    include_dirs=["csrc/include", "csrc/src"],
    extra_compile_args=["-std=c++17", "-O3", "-fPIC", "-pthread", "-fvisibility=hidden",
                        "-Wall", "-Wno-sign-compare"],
    # -ldl: dlopen of the CUDA runtime and NCCL at run time (part of libc since glibc 2.34).
    extra_link_args=["-pthread", "-ldl"],
    language="c++",
)

setup(
    name="perseus",
    version="0.1.0",
    description="Horovod-compatible data-parallel training over one framework-neutral C++ core",
    packages=find_packages(include=["perseus", "perseus.*"]),
    # The TensorFlow ops and the MXNet engine bridge are compiled on first use: ship
    # their source and the C ABI header (a symlink to csrc/include).
    package_data={"perseus.tensorflow": ["csrc/*.cc", "csrc/include/perseus/*.h"],
                  "perseus.mxnet": ["csrc/*.cc", "csrc/include/perseus/*.h"]},
    ext_modules=[core],
    cmdclass={"build_ext": BuildCore},
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require={"torch": ["torch"], "test": ["pytest", "pytest-timeout", "mpi4py"]},
    entry_points={"console_scripts": ["perseusrun = perseus.launcher:main",
                                      "perseus-timeline-summary = perseus.timeline_summary:main"]},
)
