"""Builds Perseus: the framework-neutral core library (csrc/) and the Python package.

The core is compiled with the MPI C++ wrapper found as $PERSEUS_MPICXX, else
`mpicxx` next to this Python (e.g. from `pip install mpich`), else `mpicxx` on
PATH. To build against a system MPI, put its bin/ first on PATH or set
PERSEUS_MPICXX=/path/to/mpicxx. Nothing from PyTorch, TensorFlow, MXNet or CUDA
is needed at build time.

The build links the wrapper's own libmpi or stops (build_support/mpi_link.py): a
one-function probe is linked first, with the core's exact command line, so a mixed
setup stops in seconds. `python setup.py build_ext --mpi-check-only` runs just that.
The core depends on the wrapper (its file and `-show`) and the headers as on its
sources, so that a build with another MPI in the same folder relinks it.

Where `ccache` is on PATH (scripts/setup.sh --all installs it), every compile goes
through it, so a fresh clone, or a core built against another MPI at the same sources
(build_support/other_mpi_core.py), compiles only what changed since any build on the
machine: its cache (~/.cache/ccache) is keyed by content, with paths inside the
checkout made relative (CCACHE_BASEDIR) and the wrapper known by `mpicxx -v`, which
names no folder. PERSEUS_CCACHE=0 compiles without it.
"""
import os
import re
import shutil
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "build_support"))
import mpi_link  # noqa: E402 - build helpers, not part of the package
from parallel_compile import compile_in_parallel  # noqa: E402


def package_version():
    """perseus.__version__, read from the source: the package's one statement of it."""
    text = (ROOT / "perseus" / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, flags=re.M).group(1)


SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "src").rglob("*.cc"))
# A changed header rebuilds the core too (setuptools compares only what it is told of).
HEADERS = sorted(str(p.relative_to(ROOT)) for top in ("include", "src")
                 for p in (ROOT / "csrc" / top).rglob("*.h"))

MISSING_MPI = """
Perseus needs an MPI installation with its C++ compiler wrapper (mpicxx) to build.
Install one, then build again, for example:
    pip install mpich mpi4py        # MPICH from PyPI, no root needed
or point the build at a system MPI:
    PERSEUS_MPICXX=/usr/bin/mpicxx pip install .
(With pip's build isolation, run pip from the environment that has mpicxx.)
"""


def compile_launcher():
    """[ccache] where it is on PATH and PERSEUS_CCACHE is not 0, else []. Sets ccache's
    settings for the compiles (unless the caller set them): paths under this checkout
    hashed as relative paths, so that clones share objects; the wrapper identified by
    its `-v` (its name, version and the compiler's), not by its file's mtime, which is
    new in every venv."""
    ccache = shutil.which("ccache")
    if os.environ.get("PERSEUS_CCACHE", "1") == "0" or ccache is None:
        return []
    os.environ.setdefault("CCACHE_BASEDIR", str(ROOT))
    os.environ.setdefault("CCACHE_COMPILERCHECK", "%compiler% -v")
    return [ccache]


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

    user_options = build_ext.user_options + [
        ("mpi-check-only", None, "link the MPI probe as the core would be linked, say which "
                                 "libmpi it took, and stop")]
    boolean_options = build_ext.boolean_options + ["mpi-check-only"]

    def initialize_options(self):
        super().initialize_options()
        self.mpi_check_only = False

    def finalize_options(self):
        super().finalize_options()
        if self.editable_mode:
            # `pip install -e .` builds in fresh temporary folders, so a rerun with
            # nothing changed recompiled the whole core; in folders of our own the
            # core is skipped while it is newer than its sources, headers and wrapper.
            self.build_temp = str(ROOT / "build" / "editable" / "temp")
            self.build_lib = str(ROOT / "build" / "editable" / "lib")

    def get_ext_filename(self, ext_name):
        return os.path.join(*ext_name.split(".")) + ".so"

    def build_extensions(self):
        mpicxx = find_mpicxx()
        if mpicxx is None:
            sys.exit(MISSING_MPI)
        wrapper = mpi_link.Wrapper.query(mpicxx)
        if wrapper is None:
            print("warning: %s answers neither -show nor -showme, so the build cannot check "
                  "which libmpi it links; init() still refuses a mixed build" % mpicxx)
            wrapper = mpi_link.Wrapper(mpicxx, [])
        # The wrapper's own folders first: setuptools adds Python's (for Debian's python
        # /usr/lib/x86_64-linux-gnu, where a system Open MPI's libmpi.so lives) before
        # the wrapper's flags, and -lmpi took the first libmpi.so found.
        # Newer setuptools keep separate C++ commands (compiler_so_cxx, linker_so_cxx)
        # that would otherwise stay $CXX without MPI's flags: set every one there is.
        for name in ("compiler_so", "compiler_so_cxx"):
            if name in self.compiler.executables:
                self.compiler.set_executable(
                    name, compile_launcher() + [mpicxx] + wrapper.first_compile_flags())
        if "compiler_cxx" in self.compiler.executables:
            self.compiler.set_executable("compiler_cxx", [mpicxx])
        for name in ("linker_so", "linker_so_cxx"):
            if name in self.compiler.executables:
                self.compiler.set_executable(name, [mpicxx, "-shared"] + wrapper.first_link_flags())
        for ext in self.extensions:
            self.check_mpi_probe(wrapper, ext)
        if self.mpi_check_only:
            return
        # The core depends on the wrapper as on its sources: after a build with another
        # MPI (or wrapper flags) in this build folder, it is relinked, not reused.
        identity = mpi_link.record_identity(wrapper, self.build_temp)
        for ext in self.extensions:
            ext.depends = sorted(set(ext.depends) | {identity})
        # build_ext -j N sets the number of compiler processes; else one per core.
        jobs = self.parallel if type(self.parallel) is int and self.parallel >= 1 else None
        compile_in_parallel(self.compiler, jobs or os.cpu_count() or 1)
        super().build_extensions()
        for ext in self.extensions:
            problem = mpi_link.check_library(wrapper, self.get_ext_fullpath(ext.name))
            if problem:
                sys.exit(problem)

    def check_mpi_probe(self, wrapper, ext):
        """Links mpi_link.PROBE_SOURCE exactly as build_extension() will link `ext`, with
        a link map naming the files the linker read, and stops on another MPI's libmpi."""
        folder = Path(self.build_temp) / "mpi_probe"
        folder.mkdir(parents=True, exist_ok=True)
        source, link_map = folder / "mpi_probe.cc", folder / "mpi_probe.map"
        source.write_text(mpi_link.PROBE_SOURCE)
        objects = self.compiler.compile([str(source)], output_dir=str(folder),
                                        include_dirs=ext.include_dirs,
                                        extra_postargs=ext.extra_compile_args)
        self.compiler.link_shared_object(
            objects, str(folder / "libmpi_probe.so"), libraries=self.get_libraries(ext),
            library_dirs=ext.library_dirs, runtime_library_dirs=ext.runtime_library_dirs,
            extra_postargs=ext.extra_link_args + ["-Wl,-Map," + str(link_map)],
            target_lang=ext.language)
        problem = mpi_link.check_probe(wrapper, link_map.read_text(errors="replace"))
        if problem:
            sys.exit(problem)
        own = wrapper.own_library()
        print("MPI: %s links %s" % (wrapper.path, own or "the libmpi of the linker's default "
                                    "folders (the wrapper names no library folder)"))


core = Extension(
    "perseus.lib.libperseus",
    sources=SOURCES,
    depends=HEADERS,
    include_dirs=["csrc/include", "csrc/src"],
    extra_compile_args=["-std=c++17", "-O3", "-fPIC", "-pthread", "-fvisibility=hidden",
                        "-Wall", "-Wno-sign-compare"],
    # -ldl: dlopen of the CUDA runtime and NCCL at run time (part of libc since glibc 2.34).
    extra_link_args=["-pthread", "-ldl"],
    language="c++",
)

setup(
    name="perseus",
    version=package_version(),
    description="Horovod-compatible data-parallel training over one framework-neutral C++ core",
    packages=find_packages(include=["perseus", "perseus.*"]),
    # The TensorFlow ops and the MXNet engine bridge are compiled on first use: ship
    # their source and the C ABI header (a symlink to csrc/include).
    package_data={"perseus.tensorflow": ["csrc/*.cc", "csrc/include/perseus/*.h"],
                  "perseus.mxnet": ["csrc/*.cc", "csrc/include/perseus/*.h"]},
    ext_modules=[core],
    cmdclass={"build_ext": BuildCore},
    python_requires=">=3.9",
    install_requires=["numpy", "cloudpickle"],
    extras_require={"torch": ["torch"], "test": ["pytest", "pytest-timeout", "mpi4py"]},
    entry_points={"console_scripts": ["perseusrun = perseus.launcher:main",
                                      "perseus-timeline-summary = perseus.timeline_summary:main"]},
)
