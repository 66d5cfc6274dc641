"""`perseusrun --check-build`: what this installation can do, in horovodrun's shape.

Frameworks are looked up without importing them (a TensorFlow import alone takes
seconds): a package counts as available when this Python can find it. MPI and NCCL
come from the core: MPI is built in, NCCL and the CUDA runtime count when they load
in this process now (perseus.common.gpu). After horovodrun's sections, Perseus adds
the paths and versions behind each answer, or why a library did not load, and the
MPI whose headers the core was compiled with: if the MPI library loaded is of another
kind (a mixed build, in which init() would refuse to start), the report says FAIL and
the command exits 1.
"""

import importlib.metadata
import importlib.util
import os

import perseus

# (label, top-level package), in horovodrun's order.
FRAMEWORKS = [("TensorFlow", "tensorflow"), ("PyTorch", "torch"), ("MXNet", "mxnet")]


def _box(flag):
    return "[X]" if flag else "[ ]"


def framework_version(package):
    """The installed version of a top-level package (None if not importable), read from
    its distribution's metadata: torch -> torch, tensorflow -> tensorflow-cpu, ..."""
    try:
        if importlib.util.find_spec(package) is None:
            return None
    except (ImportError, ValueError):
        return None
    for dist in importlib.metadata.packages_distributions().get(package, []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown version"


def _core():
    """(library module or None, why not)."""
    try:
        from perseus.common import library
    except ImportError as e:
        return None, str(e)
    return library, None


def _gpu_operations():
    for name in ("PERSEUS_GPU_OPERATIONS", "HOROVOD_GPU_OPERATIONS"):
        if os.environ.get(name):
            return "%s (%s)" % (os.environ[name].lower(), name)
    return "nccl (default; PERSEUS_GPU_OPERATIONS=mpi stages through host memory)"


def report():
    """(text, ok): the report, and whether the core library loads with the MPI it was
    compiled for."""
    library, why_not = _core()
    nccl = 0
    if library is not None:
        from perseus.common import gpu
        nccl = gpu.nccl_built()
    versions = {package: framework_version(package) for _, package in FRAMEWORKS}

    lines = ["Perseus v%s:" % perseus.__version__, "", "Available Frameworks:"]
    lines += ["    %s %s" % (_box(versions[package]), label) for label, package in FRAMEWORKS]
    lines += ["", "Available Controllers:",
              "    %s MPI" % _box(library), "    [ ] Gloo",
              "", "Available Tensor Operations:",
              "    %s NCCL" % _box(nccl), "    [ ] DDL", "    [ ] CCL",
              "    %s MPI" % _box(library), "    [ ] Gloo", "", "Details:"]

    def detail(key, value):
        text = str(value).strip().splitlines() or [""]
        lines.append("    %-16s %s" % (key + ":", text[0]))
        lines.extend("    %-16s %s" % ("", more) for more in text[1:])

    for label, package in FRAMEWORKS:
        detail(label, versions[package] or "not found by this Python")
    if library is None:
        detail("core", "NOT LOADED: %s" % why_not)
        return "\n".join(lines), False
    from perseus.common import exceptions, gpu
    ok = True
    detail("core", library.LIBRARY_PATH)
    detail("MPI headers", library.mpi_header_version())
    detail("MPI library", library.mpi_library_version() or "version unknown")
    try:
        library.check_mpi_library()
    except exceptions.HorovodInternalError as e:
        detail("MPI check", "FAIL: %s" % e)
        ok = False
    else:
        detail("MPI check", "ok (the library can serve the headers' MPI)")
    from perseus.common import basics
    built, why = basics.fault_tolerance(built=True)
    detail("fault tolerance", ("yes (ULFM): %s" if built else "no: %s") % why)
    described = gpu.describe() or "(no description)"
    detail("GPU libraries", described)
    if "GPU operations" not in described:  # the core names the mode it would use, where it can
        detail("GPU operations", _gpu_operations())
    return "\n".join(lines), ok


def main():
    text, ok = report()
    print(text, flush=True)
    return 0 if ok else 1
