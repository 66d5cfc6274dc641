"""The build links the MPI whose compiler wrapper it compiles with, or stops (issue 32,
point 3): build_support/mpi_link.py and its use in setup.py.

- The comparison, on real ELF files: two fake MPIs (libmpi.so.12 and libmpi.so.40)
  built here, a library linked against one and a wrapper naming the other.
- setup.py's probe (`build_ext --mpi-check-only`, about a second), with this venv's
  python and with Debian's /usr/bin/python3, whose library folder
  /usr/lib/x86_64-linux-gnu holds a system Open MPI's libmpi.so: setuptools names that
  folder before the wrapper's, which made `pip install .` link Open MPI's libmpi.so.40
  into a build compiled with the mpich wheel's mpi.h.
"""
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from support.jobs import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "build_support"))
import mpi_link  # noqa: E402
from elf_dynamic import dynamic_entries  # noqa: E402

MPICH_WHEEL_SHOW = ("c++ -I/v/include -L/v/lib -Wl,-rpath -Wl,/v/lib -Wl,--enable-new-dtags "
                    "-lmpi")
OPEN_MPI_SHOW = ("g++ -I/usr/lib/x86_64-linux-gnu/openmpi/include "
                 "-I/usr/lib/x86_64-linux-gnu/openmpi/include/openmpi "
                 "-L/usr/lib/x86_64-linux-gnu/openmpi/lib -lmpi_cxx -lmpi")
DEBIAN_MPICH_SHOW = ("g++ -Wl,-z,relro -I/usr/include/x86_64-linux-gnu/mpich "
                     "-L/usr/lib/x86_64-linux-gnu -lmpichcxx -lmpich")


@pytest.mark.parametrize("text, includes, folders, name", [
    (MPICH_WHEEL_SHOW, ["/v/include"], ["/v/lib"], "mpi"),
    (OPEN_MPI_SHOW, ["/usr/lib/x86_64-linux-gnu/openmpi/include",
                     "/usr/lib/x86_64-linux-gnu/openmpi/include/openmpi"],
     ["/usr/lib/x86_64-linux-gnu/openmpi/lib"], "mpi"),
    (DEBIAN_MPICH_SHOW, ["/usr/include/x86_64-linux-gnu/mpich"], ["/usr/lib/x86_64-linux-gnu"],
     "mpich"),
    ("icpx -I /opt/intel/include -L /opt/intel/lib -lmpicxx -lmpifort -lmpi -ldl",
     ["/opt/intel/include"], ["/opt/intel/lib"], "mpi"),
])
def test_wrapper_flags(text, includes, folders, name):
    wrapper = mpi_link.Wrapper("mpicxx", text.split()[1:])
    assert (wrapper.include_dirs, wrapper.library_dirs, wrapper.library_name()) == \
        (includes, folders, name)
    assert wrapper.first_compile_flags() == ["-I" + d for d in includes]
    assert wrapper.first_link_flags() == ["-L" + d for d in folders]


def _cc():
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("no C compiler (cc, gcc) on PATH")
    return compiler


@pytest.fixture(scope="module")
def two_mpis(tmp_path_factory):
    """Folders `mpich` (libmpi.so.12, reached through a linker script, as in the mpich
    wheel) and `ompi` (libmpi.so.40, through a symlink), and `built`: a library linked
    with -lmpi against ompi's, as the mixed build was."""
    root = tmp_path_factory.mktemp("two_mpis")
    source = root / "mpi.c"
    source.write_text("int MPI_Get_library_version(char* v, int* n) { *n = 0; return 0; }\n")
    for folder, soname, link in (("mpich", "libmpi.so.12", "script"),
                                 ("ompi", "libmpi.so.40", "symlink")):
        (root / folder).mkdir()
        subprocess.run([_cc(), "-shared", "-fPIC", "-Wl,-soname," + soname, "-o",
                        str(root / folder / soname), str(source)], check=True)
        if link == "script":
            (root / folder / "libmpi.so").write_text("INPUT(%s)\n" % soname)
        else:
            (root / folder / "libmpi.so").symlink_to(soname)
    user = root / "user.c"
    user.write_text("int MPI_Get_library_version(char*, int*);\n"
                    "int probe(char* v, int* n) { return MPI_Get_library_version(v, n); }\n")
    link_map = root / "built.map"
    # ompi's folder first, as Python's library folder came first on the real line.
    subprocess.run([_cc(), "-shared", "-fPIC", "-o", str(root / "built.so"), str(user),
                    "-L" + str(root / "ompi"), "-L" + str(root / "mpich"), "-lmpi",
                    "-Wl,-Map," + str(link_map)], check=True)
    return root


def _wrapper(folder):
    return mpi_link.Wrapper("/x/bin/mpicxx", ["-I/x/include", "-L" + str(folder), "-lmpi"])


def test_own_library_follows_scripts_and_symlinks(two_mpis):
    assert _wrapper(two_mpis / "mpich").own_library() == str(two_mpis / "mpich" / "libmpi.so.12")
    assert _wrapper(two_mpis / "ompi").own_library() == str(two_mpis / "ompi" / "libmpi.so.40")
    # No folder named: nothing to compare with, so no verdict.
    assert mpi_link.Wrapper("mpicxx", ["-lmpi"]).own_library() is None


def test_check_library_names_both_libraries(two_mpis):
    built = str(two_mpis / "built.so")
    assert mpi_link.check_library(_wrapper(two_mpis / "ompi"), built) is None
    problem = mpi_link.check_library(_wrapper(two_mpis / "mpich"), built)
    assert "%s needs libmpi.so.40\n" % built in problem, problem
    assert "but /x/bin/mpicxx belongs to libmpi.so.12 (%s)\n" % (
        two_mpis / "mpich" / "libmpi.so.12") in problem, problem
    assert "PERSEUS_MPICXX=/path/to/that/mpicxx pip install ." in problem, problem


def test_check_probe_reads_the_link_map(two_mpis):
    link_map = (two_mpis / "built.map").read_text()
    assert mpi_link.check_probe(_wrapper(two_mpis / "ompi"), link_map) is None
    problem = mpi_link.check_probe(_wrapper(two_mpis / "mpich"), link_map)
    assert "the link takes libmpi.so.40 (%s)\n" % (two_mpis / "ompi" / "libmpi.so.40") in problem
    assert ("The linker found it in %s, searched before the wrapper's own %s."
            % (two_mpis / "ompi", two_mpis / "mpich")) in problem, problem
    # The mpich wheel's way: the script and the library it names are one library.
    wheel_map = "LOAD {0}/libmpi.so\nLOAD {0}/libmpi.so.12\n".format(two_mpis / "mpich")
    assert mpi_link.check_probe(_wrapper(two_mpis / "mpich"), wheel_map) is None


def _probe(python, tmp_path, env=None):
    """setup.py build_ext --mpi-check-only: the probe only, built in tmp_path."""
    return subprocess.run([str(python), "setup.py", "-q", "build_ext", "--mpi-check-only",
                           "--build-temp", str(tmp_path / "temp"), "--build-lib",
                           str(tmp_path / "lib")],
                          cwd=str(REPO_ROOT), env=dict(os.environ, **(env or {})),
                          capture_output=True, text=True, timeout=120)


def _venv_mpicxx():
    mpicxx = os.path.join(os.path.dirname(sys.executable), "mpicxx")
    if not os.access(mpicxx, os.X_OK):
        pytest.fail("no mpicxx next to %s: run scripts/setup.sh" % sys.executable)
    return mpicxx


def test_setup_probe_links_the_wrappers_libmpi(tmp_path):
    mpicxx = _venv_mpicxx()
    res = _probe(sys.executable, tmp_path, {"PERSEUS_MPICXX": mpicxx})
    assert res.returncode == 0, res.stdout + res.stderr
    own = mpi_link.Wrapper.query(mpicxx).own_library()
    assert own and "MPI: %s links %s\n" % (mpicxx, own) in res.stdout, res.stdout


DEBIAN_PYTHON = "/usr/bin/python3"


def _debian_libdir():
    """Debian python's LIBDIR when it holds another MPI's libmpi.so, else a skip."""
    code = "import setuptools, sysconfig; print(sysconfig.get_config_var('LIBDIR'))"
    try:
        res = subprocess.run([DEBIAN_PYTHON, "-c", code], capture_output=True, text=True,
                             timeout=60)
    except OSError:
        res = None
    if res is None or res.returncode != 0:
        pytest.skip("%s with setuptools not found (apt-get install python3-setuptools)"
                    % DEBIAN_PYTHON)
    libdir = res.stdout.strip()
    if not os.path.exists(os.path.join(libdir, "libmpi.so")):
        pytest.skip("no libmpi.so in %s (Debian python's LIBDIR): no system MPI to mix in "
                    "(apt-get install libopenmpi-dev; scripts/setup.sh does)" % libdir)
    return libdir


def test_setup_probe_with_debian_python_links_the_wheels_libmpi(tmp_path):
    """The setting that linked Open MPI: Debian's python, the mpich wheel's mpicxx."""
    libdir = _debian_libdir()
    assert sysconfig.get_config_var("LIBDIR") != libdir  # this venv's python is not Debian's
    mpicxx = _venv_mpicxx()
    other = mpi_link.library_file(os.path.join(libdir, "libmpi.so"))
    own = mpi_link.Wrapper.query(mpicxx).own_library()
    assert own and other != own  # two MPIs, so a wrong link would show
    res = _probe(DEBIAN_PYTHON, tmp_path, {"PERSEUS_MPICXX": mpicxx})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "MPI: %s links %s\n" % (mpicxx, own) in res.stdout, res.stdout
    link_map = (tmp_path / "temp" / "mpi_probe" / "mpi_probe.map").read_text()
    assert list(mpi_link.linked_libraries(link_map, "mpi")) == [own]


def test_wrapper_identity_is_rewritten_only_when_it_changes(tmp_path):
    """mpi_wrapper.txt, the core's dependency on its MPI: rewritten (newer than a core
    built before) for another wrapper file or other -show flags, untouched otherwise."""
    flags = ["-I/x/include", "-L/x/lib", "-lmpi"]
    wrapper = mpi_link.Wrapper("/x/bin/mpicxx", flags, "c++ " + " ".join(flags))
    path = mpi_link.record_identity(wrapper, str(tmp_path / "temp"))
    assert open(path).read() == "/x/bin/mpicxx\nc++ -I/x/include -L/x/lib -lmpi\n"
    os.utime(path, (0, 0))
    assert mpi_link.record_identity(wrapper, str(tmp_path / "temp")) == path
    assert os.stat(path).st_mtime == 0  # the same wrapper: a built core stays up to date
    for other in (mpi_link.Wrapper("/y/bin/mpicxx", flags, wrapper.show),
                  mpi_link.Wrapper("/x/bin/mpicxx", flags, "g++ " + " ".join(flags)),
                  mpi_link.Wrapper("/x/bin/mpicxx", flags[:2] + ["-lmpich"])):
        os.utime(path, (0, 0))
        assert mpi_link.record_identity(other, str(tmp_path / "temp")) == path
        assert os.stat(path).st_mtime > 0 and open(path).read() == other.identity()


MINI_CORE = """#include <mpi.h>
#include "perseus/perseus.h"
extern "C" int perseus_mini(char* text, int* length) { return MPI_Get_library_version(text, length); }
"""


def _open_mpi_cxx():
    path = shutil.which("mpicxx.openmpi")
    if path is None:
        pytest.skip("Open MPI is not installed (mpicxx.openmpi not on PATH): apt-get install "
                    "libopenmpi-dev openmpi-bin (scripts/setup.sh does)")
    return path


def test_another_mpi_in_the_same_build_folder_relinks_the_core(tmp_path):
    """`pip install .` with the mpich wheel's mpicxx, then with PERSEUS_MPICXX=
    mpicxx.openmpi in the same folder: setuptools kept build/'s MPICH core, as its sources
    were not newer, and the link check stopped the build. setup.py and build_support/ as
    they are, around a one-file core (about a second a build)."""
    wrappers = {"mpich": _venv_mpicxx(), "openmpi": _open_mpi_cxx()}
    tree = tmp_path / "tree"
    shutil.copytree(REPO_ROOT / "build_support", tree / "build_support",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "setup.py", tree)
    (tree / "csrc" / "include" / "perseus").mkdir(parents=True)
    (tree / "csrc" / "src").mkdir()
    header = tree / "csrc" / "include" / "perseus" / "perseus.h"
    header.write_text("// the C ABI\n")
    (tree / "csrc" / "src" / "core.cc").write_text(MINI_CORE)
    (tree / "perseus").mkdir()
    (tree / "perseus" / "__init__.py").write_text('__version__ = "0.0.0"\n')  # setup.py reads it

    def build(mpi):
        """-> (the core's mtime, the libmpi it needs) after setup.py build_ext with `mpi`."""
        res = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=str(tree),
                             env=dict(os.environ, PERSEUS_MPICXX=wrappers[mpi]),
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, "build with %s failed:\n%s%s" % (mpi, res.stdout, res.stderr)
        [core] = (tree / "build").glob("lib.*/perseus/lib/libperseus.so")
        needed = [n for n in dynamic_entries(str(core))["NEEDED"] if n.startswith("libmpi.so")]
        return core.stat().st_mtime_ns, needed

    first, needed = build("mpich")
    assert needed == ["libmpi.so.12"]
    switched, needed = build("openmpi")
    assert switched != first and needed == ["libmpi.so.40"]
    assert build("openmpi") == (switched, needed)  # nothing changed: not relinked
    os.utime(header)  # a header is a dependency too
    assert build("openmpi")[0] != switched
