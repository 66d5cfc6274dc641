#!/usr/bin/env python
"""The set-up decisions of scripts/gpu_check.sh, made in Python so that they can be
tested on a CPU machine and read in one place. Run by the base Python (the one whose
torch the check uses):

  plan VENV WHEELS   the decisions as shell lines for gpu_check.sh to eval, each after
                     comments that say why (`gpu_check.sh --plan` prints them);
                     exit 2, saying why, where no usable MPI exists
  nccl [PATH] DEST   which NCCL the GPU tests use and whether it runs several ranks on
                     one GPU, as shell lines to eval (see nccl_plan); changes nothing
  make-venv VENV     creates VENV so that it sees this Python's packages

What it decides (the facts behind it: ../shared/gpu-machine.md):
  * The venv. Where this Python is itself a venv, `venv --system-site-packages` would
    show the new venv the packages of the interpreter under it, not this venv's torch;
    VENV then gets a .pth file naming the folders this Python's site module adds (a
    .pth appends after VENV's own site-packages, so what VENV installs wins).
    Otherwise --system-site-packages is enough.
  * ONE MPI, to build with (mpicxx), launch with (mpirun) and for mpi4py to load:
      1. $PERSEUS_MPICXX, if set;
      2. the system's: the first mpicxx on PATH that no Python environment holds. It
         wins over the wheel because an MPICH wheel build on a machine with a system
         MPI linked the system's libmpi while compiling MPICH's headers, and init()
         then hung;
      3. MPICH: the one already in VENV, or the mpich wheel from WHEELS.
    mpirun is the one beside that mpicxx, and both must be of one MPI.
  * For Open MPI: permission to run as root, oversubscription, and an rsh agent that
    exists where neither ssh nor rsh does (without one its mpirun refuses even a local
    launch, and a plain python's singleton init fails; a local launch never calls it).
  * How the tests see the choice: PERSEUS_MPIRUN (tests/conftest.py find_mpirun and
    perseusrun honour it), MPI4PY_LIBMPI (mpi4py loads that libmpi), and
    PERSEUS_KEEP_ENV, the variables tests/conftest.py clean_env passes on to jobs.
  * Which NCCL: the one given (--nccl PATH: a libnccl.so.2, or an .xz of one, which is
    unpacked to DEST), else the one torch loads. Several ranks on one GPU need NCCL 2.30
    or later: with it, gpu_check runs the shared-GPU NCCL configurations and their stress
    runs; without, it says why they are left out. A check_multi_rank.py beside the given
    file (../shared/nccl/ has one) checks that NCCL alone first.
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "build_support"))
import mpi_link  # noqa: E402  (the build's own reading of libraries and linker scripts)
from perseus import launcher  # noqa: E402  (pure Python: needs no built library)

SETUP_ERROR = 2
# Prefixes of system installations: an MPI under them is the system's even when the
# Python running this is the system's too.
SYSTEM_PREFIXES = {"/", "/usr", "/usr/local"}
PTH_NAME = "perseus_gpu_check_base.pth"


class PlanError(Exception):
    """No consistent MPI can be chosen; the message says why and what to do."""


# ---------------------------------------------------------------- the venv

def base_is_venv():
    return sys.prefix != sys.base_prefix


def _sys_path(*flags):
    out = subprocess.run([sys.executable] + list(flags) + ["-c", "import sys; print('\\n'.join(sys.path))"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return out.splitlines()


def site_dirs():
    """The folders this Python's site module adds to sys.path, in order: its
    site-packages, the system's where its venv includes them, the user site, and what
    .pth files add. (-S leaves out exactly those; PYTHONPATH is in both.)"""
    bare = set(_sys_path("-S"))
    return [p for p in _sys_path() if p not in bare and os.path.isdir(p)]


def venv_lines():
    if not base_is_venv():
        return ["# venv: %s is no venv itself: --system-site-packages shows the venv its packages"
                % sys.executable, "VENV_MODE=system-site-packages"]
    return (["# venv: %s is itself a venv (prefix %s on %s): a --system-site-packages venv would see"
             % (sys.executable, sys.prefix, sys.base_prefix),
             "#   %s's packages, not this one's torch; the venv gets %s naming, after its own:"
             % (sys.base_prefix, PTH_NAME)]
            + ["#     %s" % d for d in site_dirs()] + ["VENV_MODE=pth"])


def make_venv(path):
    import importlib.util
    import venv
    system = not base_is_venv()
    # Where this Python has pip, the venv sees it and uses it (pip installs into the
    # Python that runs it). ensurepip would add a pip, and on Python < 3.12 a setuptools
    # older than this Python's, which the venv's own copy would then shadow.
    with_pip = importlib.util.find_spec("pip") is None
    venv.EnvBuilder(system_site_packages=system, with_pip=with_pip).create(path)
    print("made %s%s; pip: %s" % (path, " with --system-site-packages" if system else "",
                                  "its own (ensurepip)" if with_pip else "%s's" % sys.executable))
    if system:
        return 0
    python = os.path.join(path, "bin", "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    dirs = site_dirs()
    with open(os.path.join(purelib, PTH_NAME), "w") as f:
        f.write("".join(d + "\n" for d in dirs))
    print("%s names %s" % (os.path.join(purelib, PTH_NAME), ", ".join(dirs)))
    return 0


# ---------------------------------------------------------------- MPI facts

def in_python_env(program):
    """Whether a program (an MPI wrapper) belongs to a Python environment, as the mpich
    wheel's do, rather than to the system."""
    prefix = os.path.dirname(os.path.dirname(os.path.abspath(program)))
    return (os.path.isfile(os.path.join(prefix, "pyvenv.cfg")) or os.path.isdir(os.path.join(prefix, "conda-meta"))
            or prefix in {sys.prefix, sys.base_prefix} - SYSTEM_PREFIXES)


def system_mpicxx(path):
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", "mpicxx")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK) and not in_python_env(candidate):
            return candidate
    return None


def mpirun_beside(mpicxx):
    """mpirun of the same installation: mpicxx.openmpi -> mpirun.openmpi, else mpirun."""
    folder, name = os.path.split(mpicxx)
    suffix = name[len("mpicxx"):] if name.startswith("mpicxx") else ""
    for candidate in ("mpirun" + suffix, "mpirun"):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def wrapper_link(mpicxx):
    """(flavour, link arguments) of an MPI C++ wrapper: Open MPI's answers -showme:link;
    MPICH's -link_info prints its whole link command (Open MPI's hands that option to
    the compiler, which rejects it, and MPICH's does the same with -showme:link)."""
    for flavour, option in ((launcher.OPENMPI, "-showme:link"), (launcher.MPICH, "-link_info")):
        res = subprocess.run([mpicxx, option], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
        if res.returncode == 0 and res.stdout.strip():
            return flavour, shlex.split(res.stdout)
    raise PlanError("%s answers neither -showme:link (Open MPI) nor -link_info (MPICH)" % mpicxx)


def compiler_dirs(mpicxx):
    """The compiler's own library folders (the wrapper hands -print-search-dirs on)."""
    res = subprocess.run([mpicxx, "-print-search-dirs"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    for line in res.stdout.splitlines():
        if line.startswith("libraries: ="):
            return line[len("libraries: ="):].split(os.pathsep)
    return []


def wrapper_libmpi(mpicxx, args=None):
    """The libmpi file an MPI wrapper links: lib<name>.so for its -lmpi (or -lmpich,
    Debian's MPICH), in its -L folders, else in the compiler's."""
    if args is None:
        args = wrapper_link(mpicxx)[1]
    names = [a[2:] for a in args if a in ("-lmpi", "-lmpich")]
    folders = [a[2:] for a in args if a.startswith("-L")] + compiler_dirs(mpicxx)
    for name in names:
        for folder in folders:
            path = os.path.join(folder, "lib%s.so" % name)
            if os.path.exists(path):
                return mpi_link.library_file(path)
    raise PlanError("cannot find the libmpi that %s links (-l %s in %s)" % (mpicxx, names, folders))


# ---------------------------------------------------------------- the MPI choice

def choose_mpi(venv, wheels, environ):
    """-> dict: source, why, mpicxx, mpirun, flavour, libmpi (a file, or a folder that
    holds it), install (the mpich wheel still to install into VENV)."""
    path = environ.get("PATH", "")
    venv_mpicxx = os.path.join(venv, "bin", "mpicxx")
    if environ.get("PERSEUS_MPICXX"):
        mpicxx = shutil.which(environ["PERSEUS_MPICXX"], path=path)
        if mpicxx is None:
            raise PlanError("PERSEUS_MPICXX=%s is not an executable" % environ["PERSEUS_MPICXX"])
        source, why = "PERSEUS_MPICXX", "PERSEUS_MPICXX names it"
    elif system_mpicxx(path):
        mpicxx = system_mpicxx(path)
        source, why = "system", ("the system's; it wins over the MPICH wheel, whose build here could link "
                                 "the system's libmpi while compiling MPICH's headers, and then init() hangs")
    elif os.path.exists(venv_mpicxx):
        mpicxx, source, why = venv_mpicxx, "venv", "no system MPI; the MPICH wheel already in the venv"
    elif glob.glob(os.path.join(wheels, "mpich-*.whl")):
        # Not installed yet: what the wheel will put in VENV (mpi4py finds libmpi in VENV/lib).
        return {"source": "wheel", "why": "no system MPI: the MPICH wheel from %s, into the venv" % wheels,
                "mpicxx": venv_mpicxx, "mpirun": os.path.join(venv, "bin", "mpirun"),
                "flavour": launcher.MPICH, "libmpi": os.path.join(venv, "lib"), "install": True}
    else:
        raise PlanError("no MPI: no mpicxx on PATH outside Python environments, none in %s and no mpich "
                        "wheel in %s; fetch the wheels (--print-download) or set PERSEUS_MPICXX" % (venv, wheels))
    mpirun = mpirun_beside(mpicxx)
    if mpirun is None:
        raise PlanError("%s has no mpirun beside it: install that MPI's launcher (Debian: openmpi-bin) "
                        "or set PERSEUS_MPICXX to another MPI's wrapper" % mpicxx)
    flavour, args = wrapper_link(mpicxx)
    try:
        run_flavour = launcher.detect_flavour(mpirun)
    except launcher.LauncherError as e:
        raise PlanError(str(e))
    if run_flavour != flavour:
        raise PlanError("%s is %s's wrapper but %s is %s's launcher: one MPI must build and launch"
                        % (mpicxx, flavour, mpirun, run_flavour))
    return {"source": source, "why": why, "mpicxx": mpicxx, "mpirun": mpirun, "flavour": flavour,
            "libmpi": wrapper_libmpi(mpicxx, args), "install": False}


def openmpi_env(environ):
    """-> [(name, value, why)]: what Open MPI's mpirun needs on a bare machine."""
    path = environ.get("PATH", "")
    env = [("OMPI_MCA_rmaps_base_oversubscribe", "1", "two ranks may share fewer cores"),
           ("OMPI_MCA_hwloc_base_binding_policy", "none",
            "no binding (mpirun's --bind-to none): the test configurations run at once, and bound "
            "to cores every job's rank 0 would share core 0")]
    if os.geteuid() == 0:
        env += [("OMPI_ALLOW_RUN_AS_ROOT", "1", "running as root, which mpirun refuses without these"),
                ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", "")]
    if environ.get("OMPI_MCA_plm_rsh_agent"):
        env.append(("OMPI_MCA_plm_rsh_agent", environ["OMPI_MCA_plm_rsh_agent"], "as set"))
    elif not (shutil.which("ssh", path=path) or shutil.which("rsh", path=path)):
        agent = shutil.which("false", path=path) or "/bin/false"
        env.append(("OMPI_MCA_plm_rsh_agent", agent,
                    "no ssh or rsh on PATH: mpirun and a singleton init refuse to start without an agent "
                    "that exists; a local launch never calls it, a remote one would fail at once"))
    return env


def plan(venv, wheels, environ):
    lines = venv_lines()
    mpi = choose_mpi(venv, wheels, environ)
    lines += ["# MPI: %s, %s" % (mpi["flavour"], mpi["why"])]
    lines += ["%s=%s" % (name, shlex.quote(str(value))) for name, value in (
        ("MPI_SOURCE", mpi["source"]), ("MPI_FLAVOUR", mpi["flavour"]), ("MPICXX", mpi["mpicxx"]),
        ("MPIRUN", mpi["mpirun"]), ("INSTALL_MPICH", int(mpi["install"])))]
    venv_mpicxx = os.path.join(venv, "bin", "mpicxx")
    if os.path.exists(venv_mpicxx) and not os.path.samefile(venv_mpicxx, mpi["mpicxx"]):
        lines += ["# the venv holds the MPICH wheel of an earlier run: removed, so no second MPI is found",
                  "REMOVE_VENV_MPICH=1"]
    else:
        lines += ["REMOVE_VENV_MPICH=0"]
    env = [("PERSEUS_MPICXX", mpi["mpicxx"], "the build's wrapper"),
           ("PERSEUS_MPIRUN", mpi["mpirun"], "the tests' and perseusrun's launcher"),
           ("MPI4PY_LIBMPI", mpi["libmpi"], "the libmpi mpi4py loads (else it takes the first it finds)")]
    if mpi["flavour"] == launcher.OPENMPI:
        env += openmpi_env(environ)
    for name, value, why in env:
        lines += (["# %s" % why] if why else []) + ["export %s=%s" % (name, shlex.quote(value))]
    # The jobs need what mpirun and mpi4py read; the PERSEUS_* ones serve this process only.
    keep = [name for name, _, _ in env if not name.startswith("PERSEUS_")]
    lines += ["# the variables tests/conftest.py clean_env passes on to the jobs",
              "export PERSEUS_KEEP_ENV=%s" % shlex.quote(" ".join(keep))]
    return lines


# ---------------------------------------------------------------- NCCL

MULTI_RANK_NCCL = 23000  # NCCL 2.30: several ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1)


def library_nccl_version(path):
    """NCCL_VERSION_CODE of a libnccl file, asked through its ncclGetVersion (a fresh
    process: loading it here would keep it loaded)."""
    code = ("import ctypes, sys; v = ctypes.c_int(); lib = ctypes.CDLL(sys.argv[1]); "
            "assert lib.ncclGetVersion(ctypes.byref(v)) == 0; print(v.value)")
    res = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise PlanError("%s does not load as NCCL: %s" % (path, (res.stderr.strip().splitlines() or ["?"])[-1]))
    return int(res.stdout.strip())


def torch_nccl():
    """(version code, library path or '') of the NCCL torch loads (0 without one)."""
    try:
        import torch
        major, minor, patch = torch.cuda.nccl.version()
    except Exception:  # CPU builds have none
        return 0, ""
    found = glob.glob(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "nccl", "lib",
                                   "libnccl.so.2"))
    return major * 10000 + minor * 100 + patch, (found[0] if found else "")


def version_text(code):
    return "%d.%d.%d" % (code // 10000, code % 10000 // 100, code % 100)


def nccl_plan(given, dest):
    """Shell lines: NCCL_LIB (the file the tests load, '' for torch's own), NCCL_XZ (an
    .xz to unpack into it first), NCCL_VERSION, MULTI_RANK (0/1), NCCL_CHECK (a
    check_multi_rank.py to run first, or ''), and PERSEUS_NCCL_LIB for a given NCCL."""
    xz, check = "", ""
    if given:
        given = os.path.abspath(given)
        if not os.path.isfile(given):
            raise PlanError("--nccl %s: no such file" % given)
        lib, source = given, "given (--nccl)"
        if given.endswith(".xz"):
            import lzma
            import tempfile
            xz, lib = given, os.path.join(os.path.abspath(dest), "libnccl.so.2")
            with tempfile.TemporaryDirectory() as tmp:  # unpacked for a look only; the run unpacks it to DEST
                probe = os.path.join(tmp, "libnccl.so.2")
                with lzma.open(given) as src, open(probe, "wb") as out:
                    shutil.copyfileobj(src, out)
                version = library_nccl_version(probe)
            source += ", unpacked from %s to %s" % (given, lib)
        else:
            version = library_nccl_version(given)
        beside = os.path.join(os.path.dirname(given), "check_multi_rank.py")
        check = beside if os.path.isfile(beside) else ""
    else:
        version, lib = torch_nccl()
        source, lib_shown, lib = "torch's own", lib or "(not found)", ""
        source += " (%s)" % lib_shown
    multi = version >= MULTI_RANK_NCCL
    lines = ["# NCCL: %s, version %s" % (source, version_text(version) if version else "unknown")]
    if multi:
        lines.append("# it runs several ranks on one GPU (2.30 or later, NCCL_MULTI_RANK_GPU_ENABLE=1): the "
                     "shared-GPU NCCL configurations (np 2 and 4, 1/2/4 lanes) and their stress runs are run")
    else:
        lines.append("# it cannot run several ranks on one GPU (NCCL 2.30 or later can): the shared-GPU NCCL "
                     "configurations are left out; give --nccl PATH (e.g. ../shared/nccl/"
                     "libnccl-2.32.3-sm90.so.2.xz), or install nvidia-nccl-cu13>=2.30 where packages are reachable")
    if check:
        lines.append("# %s checks that NCCL alone first (torch with CUDA, no MPI, no Perseus)" % check)
    lines += ["%s=%s" % (name, shlex.quote(str(value))) for name, value in (
        ("NCCL_LIB", lib), ("NCCL_XZ", xz), ("NCCL_VERSION", version), ("MULTI_RANK", int(multi)),
        ("NCCL_CHECK", check))]
    if lib:
        lines += ["# Perseus loads it, not torch's (PERSEUS_NCCL_LIB; clean_env passes it on to the jobs)",
                  "export PERSEUS_NCCL_LIB=%s" % shlex.quote(lib),
                  'export PERSEUS_KEEP_ENV="$PERSEUS_KEEP_ENV PERSEUS_NCCL_LIB"']
    return lines


def main(argv):
    if len(argv) == 3 and argv[0] == "plan":
        try:
            print("\n".join(plan(argv[1], argv[2], os.environ)))
        except PlanError as e:
            print("no set-up possible: %s" % e, file=sys.stderr)
            return SETUP_ERROR
        return 0
    if len(argv) == 3 and argv[0] == "nccl":
        try:
            print("\n".join(nccl_plan(argv[1], argv[2])))
        except PlanError as e:
            print("no NCCL set-up possible: %s" % e, file=sys.stderr)
            return SETUP_ERROR
        return 0
    if len(argv) == 2 and argv[0] == "make-venv":
        return make_venv(argv[1])
    sys.exit("usage: gpu_check_plan.py plan VENV WHEELS | nccl PATH|'' DEST | make-venv VENV")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
