"""Whether an mpirun can start ranks of this Perseus: its MPI must be of the kind the
core was compiled with. Another MPI's launcher starts processes the core's MPI cannot
join: MPICH under Open MPI's mpirun aborts inside MPI_Init ("unsupported PMI version
PMIx", once per rank), and Open MPI under MPICH's mpirun comes up as N worlds of one.
perseusrun asks here before it starts anything; the core says the same in each rank
before MPI_Init (csrc/src/mpi/launcher_pmi.cc), for a launch without perseusrun.
"""

import os

OPENMPI = "openmpi"  # launcher.OPENMPI and launcher.MPICH, which imports this module
MPICH = "mpich"
NAMES = {OPENMPI: "Open MPI", MPICH: "MPICH"}


def family(header):
    """OPENMPI or MPICH for the MPI named by the core's perseus_mpi_header_version()
    ("MPICH 5.0.2", "Intel MPI 2021.9", "Open MPI 4.1.4"), None when unknown."""
    if header.startswith("Open MPI"):
        return OPENMPI
    if header.startswith(("MPICH", "Intel MPI", "MVAPICH")):  # the MPICH ABI, Hydra's launchers
        return MPICH
    return None


def compatible(header, flavour):
    """Whether an mpirun of `flavour` can start ranks of a core built with `header`'s
    MPI (an MPI of unknown kind is given the benefit of the doubt)."""
    kind = family(header)
    return kind is None or kind == flavour


def core():
    """(the core's MPI, the core's file), or None when the core cannot be loaded here
    (then the ranks' own import says why; nothing to compare)."""
    try:
        from perseus.common import library
    except ImportError:
        return None
    return library.mpi_header_version(), library.LIBRARY_PATH


def check(mpirun, flavour, detect, candidates):
    """None when `mpirun` (of `flavour`) suits the core, else the refusal: what is wrong
    and the launcher to use, the first of `candidates` whose flavour (`detect`) suits
    (the first candidate is perseusrun's default)."""
    found = core()
    if found is None or compatible(found[0], flavour):
        return None
    header, library = found
    use = "the mpirun of %s (none found beside this Python nor on PATH)" % header
    for i, candidate in enumerate(candidates):
        try:
            if not candidate or os.path.realpath(candidate) == os.path.realpath(mpirun) \
                    or not compatible(header, detect(candidate)):
                continue
        except Exception:  # an mpirun that cannot say what it is: not the one to name
            continue
        use = ("%s, perseusrun's default (drop --mpirun and $PERSEUS_MPIRUN)" % candidate
               if i == 0 else "--mpirun %s" % candidate)
        break
    what = ("MPICH's MPI_Init aborts under Open MPI's launcher, \"unsupported PMI version "
            "PMIx\"" if flavour == OPENMPI else "each would start alone as rank 0 of 1")
    return ("%s is %s's mpirun, but Perseus (%s) was built with %s: the ranks it starts "
            "could not join: %s. Fix: use %s's own mpirun, %s; or rebuild Perseus with "
            "that mpirun's MPI (PERSEUS_MPICXX=/path/to/its/mpicxx pip install .)"
            % (mpirun, NAMES[flavour], library, header, what, header, use))
