"""Which libmpi the core's build links, and whether it is the MPI compiler wrapper's own.

Compiled with one MPI's mpi.h and linked with another's libmpi (MPICH's header, Open
MPI's libmpi.so.40), libperseus hangs or crashes in its first MPI call. That happened
when the compiler line setuptools builds named Python's library folder (Debian's
python: /usr/lib/x86_64-linux-gnu, where a system Open MPI's libmpi.so lives) before
the wrapper's own -L folder. setup.py therefore puts the wrapper's folders first
(Wrapper.first_*_flags), links a one-function probe with the exact line the core will
use and reads from the link map which libmpi the linker took (check_probe, seconds,
before the long compile), and checks the finished library's NEEDED entries (check_library). The
texts of both failures are here, in MIXED.
"""
import os
import re
import shlex
import subprocess

from elf_dynamic import NotElf, dynamic_entries

# The -l names of MPI C libraries: -lmpi (MPICH, Open MPI, Intel MPI, MVAPICH2) or
# -lmpich (Debian's MPICH). Not the C++ bindings (-lmpi_cxx, -lmpichcxx).
MPI_LIBRARY_NAMES = ("mpi", "mpich")

# Linked with the core's flags, it pulls in the same libmpi the core will.
PROBE_SOURCE = """#include <mpi.h>
extern "C" int perseus_mpi_probe(char* text, int* length) {
  return MPI_Get_library_version(text, length);
}
"""

MIXED = """
The MPI library Perseus would link is not the one its compiler wrapper belongs to:
    {what} {linked}
    but {mpicxx} belongs to {own}
Compiled with one MPI's mpi.h and linked with another MPI's libmpi, Perseus would hang
or crash in init() (a build like that is refused at run time too).{why}
Build with the mpicxx of the one MPI you will run with (its mpirun too), e.g.
    PERSEUS_MPICXX=/path/to/that/mpicxx pip install .
and keep other MPIs' library folders out of LIBRARY_PATH and LDFLAGS for the build.
"""

WHY_SEARCH_ORDER = ("\nThe linker found it in {found}, searched before the wrapper's own "
                    "{folders}.")


class Wrapper:
    """What an MPI compiler wrapper adds to a command line, from `mpicxx -show` (MPICH,
    Intel MPI, MVAPICH2, Open MPI) or `-showme` (Open MPI)."""

    def __init__(self, path, flags, show=None):
        self.path = path
        self.show = " ".join(flags) if show is None else show  # -show's text
        self.include_dirs, self.library_dirs, self.libraries = [], [], []
        tokens = iter(flags)
        for token in tokens:
            for prefix, found in (("-I", self.include_dirs), ("-L", self.library_dirs),
                                  ("-l", self.libraries)):
                if token.startswith(prefix):
                    value = token[len(prefix):] or next(tokens, "")
                    if value:
                        found.append(value)
                    break

    @classmethod
    def query(cls, path):
        """The wrapper's flags, or None when it answers neither -show nor -showme."""
        for option in ("-show", "-showme"):
            try:
                res = subprocess.run([path, option], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.SubprocessError):
                continue
            if res.returncode == 0 and res.stdout.strip():
                return cls(path, shlex.split(res.stdout)[1:], res.stdout.strip())  # [0]: the compiler
        return None

    def library_name(self):
        """The -l name of the MPI C library it links (the last one named), or None."""
        names = [name for name in self.libraries if name in MPI_LIBRARY_NAMES]
        return names[-1] if names else None

    def own_library(self):
        """The file of its MPI C library in the first of its -L folders that holds one,
        or None when it names no such folder (the library then comes from the
        linker's default folders, and there is nothing else to compare with)."""
        name = self.library_name()
        for folder in self.library_dirs if name else ():
            candidate = os.path.join(folder, "lib%s.so" % name)
            if os.path.exists(candidate):
                return library_file(candidate)
        return None

    def identity(self):
        """The wrapper's file and the command it runs (-show): a core built with a wrapper
        of another identity is stale."""
        return "%s\n%s\n" % (os.path.realpath(self.path), self.show)

    def first_compile_flags(self):
        """Its -I folders, to put before any other on the compile line."""
        return ["-I" + folder for folder in self.include_dirs]

    def first_link_flags(self):
        """Its -L folders, to put before any other on the link line: `-lmpi` then finds
        its libmpi first, whatever folders setuptools adds."""
        return ["-L" + folder for folder in self.library_dirs]


def record_identity(wrapper, folder):
    """folder/mpi_wrapper.txt, holding the wrapper's identity; rewritten (so newer) only
    when that changed. As a dependency of the core, it makes setuptools relink a core
    built with another MPI, which it kept otherwise (its sources were not newer), and
    leaves one built with this wrapper alone."""
    path = os.path.join(folder, "mpi_wrapper.txt")
    text = wrapper.identity()
    try:
        with open(path) as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def library_file(path):
    """The real file behind a library path: symlinks followed, and a linker script
    (the mpich wheel's libmpi.so is `INPUT(libmpi.so.12)`: wheels hold no symlinks)
    followed to the library it names in its own folder."""
    path = os.path.realpath(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return path
    if head.startswith(b"\x7fELF"):
        return path
    match = re.search(rb"(?:INPUT|GROUP)\s*\(\s*([^\s()]+)", head)
    if match:
        named = match.group(1).decode("utf-8", "replace")
        candidate = os.path.join(os.path.dirname(path), named)
        if os.path.exists(candidate):
            return os.path.realpath(candidate)
    return path


def linked_libraries(link_map, name):
    """{real file: the path the linker read it as} for each lib<name>.so it read, from
    its link map (-Wl,-Map,FILE: GNU ld lists each input as `LOAD /path/libmpi.so`,
    lld names them in its table)."""
    pattern = re.compile(r"(/[^\s()]*/lib%s\.so[^\s()/]*)" % re.escape(name))
    found = {}
    for path in pattern.findall(link_map):
        found.setdefault(library_file(path), path)
    return found


def soname(path):
    try:
        return dynamic_entries(path)["SONAME"] or os.path.basename(path)
    except (OSError, NotElf, IndexError, ValueError):
        return os.path.basename(path)


def _describe(path):
    return "%s (%s)" % (soname(path), path)


def check_probe(wrapper, link_map):
    """None when the probe's link took only the wrapper's own libmpi, else the error
    text. Nothing to compare (None) when the wrapper names no library folder."""
    own = wrapper.own_library()
    if own is None:
        return None
    linked = linked_libraries(link_map, wrapper.library_name())
    if list(linked) == [own]:
        return None
    found = sorted({os.path.dirname(path) for real, path in linked.items() if real != own})
    return MIXED.format(
        what="the link takes", linked=", ".join(map(_describe, sorted(linked))) or "no libmpi at all",
        mpicxx=wrapper.path, own=_describe(own),
        why=WHY_SEARCH_ORDER.format(found=", ".join(found), folders=", ".join(
            wrapper.library_dirs)) if found else "")


def check_library(wrapper, built):
    """None when the built library NEEDs the wrapper's libmpi soname and no other
    lib<name>.so, else the error text (or nothing to compare, as check_probe)."""
    own = wrapper.own_library()
    if own is None:
        return None
    prefix = "lib%s.so" % wrapper.library_name()
    needed = [entry for entry in dynamic_entries(built)["NEEDED"] if entry.startswith(prefix)]
    if needed == [soname(own)]:
        return None
    return MIXED.format(what="%s needs" % built, linked=", ".join(needed) or "no libmpi at all",
                        mpicxx=wrapper.path, own=_describe(own), why="")
