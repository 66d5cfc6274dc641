"""Where the CUDA runtime and NCCL come from, and whether they load.

The core loads libcudart and libnccl.so.2 at run time (no CUDA at build time). It
looks in PERSEUS_CUDA_LIB / PERSEUS_NCCL_LIB first, then in the folders given here
once through perseus_set_gpu_library_dirs, then on the system loader path. This
module finds those folders without importing any framework:

  1. folders of a libcudart / libnccl already mapped into this process (a framework
     imported first loaded its own; a second copy of NCCL in one process is trouble);
  2. for each installed framework package (torch first): its own lib/ and the
     nvidia/*/lib folders of the wheels beside it (CUDA 12 wheels: nvidia/nccl/lib,
     nvidia/cuda_runtime/lib; CUDA 13 wheels: nvidia/nccl/lib, nvidia/cu13/lib);
  3. nvidia/*/lib in every other folder on sys.path (a venv and the system site).

cuda_built() / nccl_built() answer Horovod's questions truthfully: whether this
process can load the library now, not whether a compiler saw CUDA.
"""

import glob
import importlib.util
import os
import re
import sys
import threading

from perseus.common import library as _lib

FRAMEWORKS = ("torch", "tensorflow", "mxnet")  # searched in this order
_LIBRARY_NAME = re.compile(r"^lib(cudart|nccl)\.so")

_lock = threading.Lock()
_prepared = None   # the folders handed to the core (a list), once set
_loaded = None     # (cuda_ok, nccl_ok) from the core, once asked


class GpuSupportMissing(RuntimeError):
    """This libperseus predates the GPU loader (a stale build)."""


def _core(name):
    """A GPU function of the C ABI (declared in library.py), None in a core built
    before the GPU path."""
    return getattr(_lib, name, None)


def supported():
    """Whether the loaded core has the GPU loader functions at all."""
    return _core("perseus_gpu_load") is not None


def _require():
    if not supported():
        raise GpuSupportMissing(
            "%s has no GPU loader (perseus_gpu_load): it was built from sources older than "
            "the GPU path. Rebuild and reinstall Perseus with `pip install .`." % _lib.LIBRARY_PATH)


# ---------------------------------------------------------------- discovery

def _unique_dirs(dirs):
    seen, out = set(), []
    for d in dirs:
        d = os.path.realpath(d)
        # The core takes a ':'-separated list: a folder with ':' in its name cannot be said.
        if d not in seen and ":" not in d and os.path.isdir(d):
            seen.add(d)
            out.append(d)
    return out


def nvidia_library_dirs(site_dir):
    """nvidia/*/lib under one site-packages folder, sorted (cu13 before cuda_runtime)."""
    return sorted(glob.glob(os.path.join(site_dir, "nvidia", "*", "lib")))


def framework_library_dirs(package_dir):
    """A framework package's own lib/ and the nvidia/*/lib folders beside it."""
    package_dir = os.path.abspath(package_dir)
    return _unique_dirs([os.path.join(package_dir, "lib")]
                        + nvidia_library_dirs(os.path.dirname(package_dir)))


def loaded_library_dirs(maps_text=None):
    """Folders of the libcudart / libnccl files mapped into this process, in map order.
    maps_text: the text of /proc/self/maps (tests pass their own)."""
    if maps_text is None:
        try:
            with open("/proc/self/maps") as f:
                maps_text = f.read()
        except OSError:  # not Linux: nothing to learn here
            return []
    dirs = []
    for line in maps_text.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            path = fields[5].strip()
            if _LIBRARY_NAME.match(os.path.basename(path)):
                dirs.append(os.path.dirname(path))
    return _unique_dirs(dirs)


def package_dir(name):
    """The folder of an installed package, found without importing it (None if absent)."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None):
        return os.path.dirname(os.path.abspath(module.__file__))
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.abspath(list(spec.submodule_search_locations)[0])


def default_dirs(first=None):
    """Every folder worth searching, best first (see the module docstring). first: a
    framework package name to put before the others (the front end asking)."""
    names = ([first] if first else []) + [n for n in FRAMEWORKS if n != first]
    dirs = loaded_library_dirs()
    for name in names:
        found = package_dir(name)
        if found:
            dirs += framework_library_dirs(found)
    for entry in sys.path:
        if entry and os.path.isdir(entry):
            dirs += nvidia_library_dirs(entry)
    return _unique_dirs(dirs)


# ---------------------------------------------------------------- the core

def prepare(dirs=None, first=None):
    """Hands the search folders to the core, once per process: later calls change
    nothing and return the folders of the first. dirs: explicit folders, else
    default_dirs(first). Call before the first GPU request (the front ends do)."""
    global _prepared
    _require()
    with _lock:
        if _prepared is None:
            chosen = _unique_dirs(dirs) if dirs is not None else default_dirs(first)
            _lib.check(_core("perseus_set_gpu_library_dirs")(os.pathsep.join(chosen).encode()))
            _prepared = chosen
        return list(_prepared)


def load():
    """(cuda_ok, nccl_ok): loads the CUDA runtime and NCCL now, preparing the default
    folders first if no front end did. Asked once; the answer is kept."""
    global _loaded
    try:
        prepare()
    except ValueError:
        pass  # the core already loaded (or tried) the libraries from folders of its own
    with _lock:
        if _loaded is None:
            import ctypes
            cuda_ok, nccl_ok = ctypes.c_int32(0), ctypes.c_int32(0)
            # Not SUCCESS when the CUDA runtime did not load: the flags say what did, describe() why.
            _core("perseus_gpu_load")(ctypes.byref(cuda_ok), ctypes.byref(nccl_ok))
            _loaded = (bool(cuda_ok.value), bool(nccl_ok.value))
        return _loaded


def describe():
    """The core's account of the GPU libraries: paths and versions, device count, or
    why loading failed and which paths were tried."""
    if not supported():
        return "GPU loader missing from this build (%s)" % _lib.LIBRARY_PATH
    load()
    raw = _core("perseus_gpu_describe")()
    return raw.decode("utf-8", "replace") if raw else ""


_TRIPLE = re.compile(r"(?<![\d.])(\d+)\.(\d+)\.(\d+)(?![\d.])")


def nccl_version_code(text):
    """NCCL_VERSION_CODE (major*10000 + minor*100 + patch, NCCL >= 2.9) from the first
    x.y.z on a line that mentions NCCL, paths left out (they hold python3.12 and the
    like); 0 when there is none. 'NCCL 2.32.3 from /x/libnccl.so.2' -> 23203."""
    for line in (text or "").splitlines():
        if "nccl" not in line.lower():
            continue
        words = " ".join(w for w in line.split() if "/" not in w)
        m = _TRIPLE.search(words)
        if m:
            major, minor, patch = (int(g) for g in m.groups())
            return major * 10000 + minor * 100 + patch
    return 0


# Horovod's answers: truthful for this process, never raising.

def cuda_built(verbose=False):
    """True when the CUDA runtime loads in this process."""
    return bool(supported() and load()[0])


def nccl_built(verbose=False):
    """NCCL's version code (truthy, as Horovod 0.28 returns) when NCCL and the CUDA
    runtime load in this process; 0 otherwise."""
    if not supported():
        return 0
    cuda_ok, nccl_ok = load()
    if not (cuda_ok and nccl_ok):
        return 0
    return nccl_version_code(describe()) or 1


# The front ends whose GPU tensors Perseus reduces (TensorFlow's and MXNet's raise
# NotImplementedError), by Horovod's extension names.
GPU_TENSOR_FRONT_ENDS = ("torch",)
_FRONT_ENDS = ("torch", "tensorflow", "mxnet", "keras")
_DEVICES = re.compile(r"devices: (\d+)")


def gpu_available(ext_base_name, verbose=False):
    """Horovod's gpu_available(): whether the front end `ext_base_name` ('torch',
    'tensorflow', 'mxnet', 'keras'; 'horovod.torch' and the like too) reduces GPU
    tensors in this process: it supports them, the CUDA runtime loads and it sees a
    device. verbose=True prints why not."""
    name = str(ext_base_name).rsplit(".", 1)[-1]
    if name not in _FRONT_ENDS:
        raise ValueError("gpu_available: unknown extension %r (one of %s)" % (ext_base_name, ", ".join(_FRONT_ENDS)))
    why = None
    if name not in GPU_TENSOR_FRONT_ENDS:
        why = "Perseus's %s front end reduces CPU tensors only" % name
    elif not cuda_built():
        why = "the CUDA runtime does not load in this process"
    else:
        found = _DEVICES.search(describe())
        if not (found and int(found.group(1)) > 0):
            why = "the CUDA runtime loads but sees no usable device"
    if why and verbose:
        print("gpu_available(%r): False: %s" % (ext_base_name, why))
    return why is None
