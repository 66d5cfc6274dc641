#!/usr/bin/env python
"""Facts scripts/gpu_check.sh needs from Python, one subcommand each:

  cuda       what torch sees; exit 0 with a CUDA device, 3 without one, 4 without torch
  versions   a Markdown list for the report: Python, torch, CUDA, NCCL, devices, MPI
  same-mpi MPICXX
             exit 0 when libperseus and mpi4py load one libmpi file, the one the wrapper
             MPICXX links, and libperseus's MPI headers match it; 1 if not, naming both
  configs    the GPU test configurations of tests/gpu/test_gpu.py, one per line
"""
import os
import re
import subprocess
import sys

NO_CUDA, NO_TORCH = 3, 4
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torch_summary(torch):
    nccl = "?"
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # CPU builds have no NCCL
        pass
    return "torch %s (CUDA %s, NCCL %s) from %s" % (torch.__version__, torch.version.cuda, nccl,
                                                   os.path.dirname(torch.__file__))


def cuda():
    try:
        import torch
    except ImportError as e:
        print("no torch in %s (%s): %s" % (sys.executable, sys.version.split()[0], e))
        return NO_TORCH
    print("python %s (%s)" % (sys.version.split()[0], sys.executable))
    print(torch_summary(torch))
    if not torch.cuda.is_available():
        why = "a CPU-only torch build" if torch.version.cuda is None else "no device or driver visible"
        print("no CUDA device: torch.cuda.is_available() is False (%s)" % why)
        return NO_CUDA
    for i in range(torch.cuda.device_count()):
        print("cuda:%d %s (compute capability %d.%d)" % ((i, torch.cuda.get_device_name(i))
                                                         + torch.cuda.get_device_capability(i)))
    return 0


def versions():
    import torch
    lines = ["- Python %s (%s)" % (sys.version.split()[0], sys.executable), "- " + torch_summary(torch)]
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        lines.append("- cuda:%d: %s, %.0f GiB, compute capability %d.%d"
                     % (i, p.name, p.total_memory / 2 ** 30, p.major, p.minor))
    try:
        import mpi4py
        mpi4py.rc.initialize = mpi4py.rc.finalize = False  # only asking, not starting MPI
        from mpi4py import MPI
        lines.append("- mpi4py %s on %s" % (mpi4py.__version__, " ".join(MPI.Get_library_version().split()[:3])))
    except Exception as e:
        lines.append("- mpi4py: %s" % e)
    print("\n".join(lines))
    return 0


def is_libmpi(name):
    """libmpi.so.40 (Open MPI), libmpi.so.12 or libmpich.so.12 (Debian's MPICH); not the
    C++ bindings (libmpi_cxx) nor MPICH's ABI library (libmpi_abi)."""
    return re.match(r"libmpi(ch)?\.so(\.\d+)*$", os.path.basename(name)) is not None


def mapped_mpi_libraries():
    with open("/proc/self/maps") as f:
        paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    return sorted({os.path.realpath(p) for p in paths if is_libmpi(p)})


def dynamic_entries(path, tag):
    """NEEDED or SONAME entries of an ELF file, read with readelf -d."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, timeout=60).stdout
    return re.findall(r"\(%s\)\s+[^\[]*\[([^\]]+)\]" % tag, out)


def soname(path):
    names = dynamic_entries(path, "SONAME")
    return names[0] if names else os.path.basename(path)


def same_mpi(mpicxx):
    sys.path.insert(0, REPO)
    from perseus.common import library  # loads libperseus and the MPI it links
    import mpi4py
    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from mpi4py import MPI
    from gpu_check_plan import PlanError, wrapper_libmpi
    found = mapped_mpi_libraries()
    print("libperseus: %s" % (library.mpi_library_version() or "?"))
    print("mpi4py:     %s" % " ".join(MPI.Get_library_version().split()[:3]))
    print("libmpi files mapped: %s" % (", ".join(found) or "none"))
    problems = []
    if len(found) != 1:
        problems.append("%d libmpi files mapped, not 1" % len(found))
    # Headers against library: libperseus's own check where it has one; the wrapper's
    # libmpi below stands in for the headers (they come from that wrapper's MPI).
    check = getattr(library, "check_mpi_library", None)
    if check is None:
        print("check_mpi_library: not in this libperseus; its headers are judged by the wrapper's libmpi")
    else:
        try:
            check()
            print("check_mpi_library: headers and library of one MPI")
        except Exception as e:
            problems.append("check_mpi_library: %s" % e)
    try:
        expected = wrapper_libmpi(mpicxx)
    except PlanError as e:
        problems.append(str(e))
    else:
        needed = [n for n in dynamic_entries(library.LIBRARY_PATH, "NEEDED") if is_libmpi(n)]
        print("%s links %s (%s); libperseus needs %s" % (mpicxx, expected, soname(expected), ", ".join(needed)))
        if needed != [soname(expected)]:
            problems.append("libperseus needs %s, but the wrapper it is built with, %s, links %s (%s): its "
                            "MPI headers and the libmpi it loads are of two MPIs"
                            % (" and ".join(needed) or "no libmpi", mpicxx, soname(expected), expected))
        elif found and found != [expected]:
            problems.append("the libmpi mapped is %s, not %s's %s" % (", ".join(found), mpicxx, expected))
    for problem in problems:
        print("FAIL: %s" % problem)
    print("PASS" if not problems else "FAIL")
    return 1 if problems else 0


def configs():
    from gpu_plan import load_test_configs  # one reader of test_gpu.py's configurations
    print("\n".join(load_test_configs()[0]))
    return 0


if __name__ == "__main__":
    commands = {"cuda": cuda, "versions": versions, "same-mpi": same_mpi, "configs": configs}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit("usage: gpu_check_info.py {%s} [MPICXX]" % ",".join(commands))
    sys.exit(commands[sys.argv[1]](*sys.argv[2:]))
