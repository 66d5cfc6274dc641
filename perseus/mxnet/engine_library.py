"""Builds (once, cached) and loads the bridge between MXNet's engine and the core.

csrc/perseus_mx_engine.cc uses no MXNet header or library (the MXNet functions it
calls arrive as pointers), so one build serves every MXNet version; it links
libperseus.so. The cache key covers the source, perseus.h, the compile command and
the core library's path. Ranks started together may all get here at once: a file
lock lets one build while the others wait; the file appears by an atomic rename.

Cache: $PERSEUS_MX_OPS_CACHE, else $XDG_CACHE_HOME/perseus, else ~/.cache/perseus.
Compiler: $CXX, else g++ (C++17).
"""

import ctypes
import fcntl
import hashlib
import os
import shlex
import subprocess
import sys

from perseus.common import library as _core

_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
SOURCE = os.path.join(_CSRC, "perseus_mx_engine.cc")
INCLUDE_DIR = os.path.join(_CSRC, "include")  # perseus/perseus.h (a symlink in the tree)

_library = None


def _cache_dir():
    if os.environ.get("PERSEUS_MX_OPS_CACHE"):
        return os.environ["PERSEUS_MX_OPS_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "perseus")


def _header():
    header = os.path.join(INCLUDE_DIR, "perseus", "perseus.h")
    if not os.path.exists(header):
        raise ImportError("cannot build the Perseus MXNet engine bridge: %s not found; "
                          "reinstall Perseus" % header)
    return header


def _command(output):
    compiler = shlex.split(os.environ.get("CXX", "g++"))
    core_dir = os.path.dirname(_core.LIBRARY_PATH)
    return compiler + ["-shared", "-fPIC", "-O2", "-std=c++17", "-pthread", SOURCE, "-o", output,
                       "-I" + INCLUDE_DIR, "-L" + core_dir, "-l:libperseus.so",
                       "-Wl,-rpath," + core_dir]


def library_path():
    key = hashlib.sha256()
    for source in (SOURCE, _header()):
        with open(source, "rb") as f:
            key.update(f.read())
    key.update(" ".join(_command("")).encode())
    return os.path.join(_cache_dir(), "perseus_mx_engine-%s.so" % key.hexdigest()[:16])


def build(path):
    """Compiles the bridge to `path` (under a lock; no-op if another process did)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path):
            return
        tmp = "%s.%d.tmp" % (path, os.getpid())
        command = _command(tmp)
        try:
            result = subprocess.run(command, capture_output=True, text=True)
        except OSError as e:
            raise ImportError("cannot build the Perseus MXNet engine bridge: could not run the "
                              "C++ compiler %r (%s); install g++ or set CXX"
                              % (command[0], e)) from e
        if result.returncode != 0:
            raise ImportError(
                "cannot build the Perseus MXNet engine bridge. Command:\n  %s\n"
                "Compiler output (last lines):\n%s"
                % (" ".join(shlex.quote(c) for c in command),
                   "\n".join(result.stderr.splitlines()[-30:])))
        os.replace(tmp, path)


def load():
    """The bridge as a ctypes.CDLL with its signatures declared (built on first use)."""
    global _library
    if _library is None:
        path = library_path()
        if not os.path.exists(path):
            print("perseus: building the MXNet engine bridge (once) into %s" % path,
                  file=sys.stderr)
            build(path)
        lib = ctypes.CDLL(path)
        vp = ctypes.c_void_p
        lib.perseus_mx_set_functions.argtypes = [vp, vp, vp, vp]
        lib.perseus_mx_set_functions.restype = None
        lib.perseus_mx_job_new.argtypes = [vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32,
                                           ctypes.POINTER(vp), ctypes.POINTER(vp)]
        lib.perseus_mx_job_new.restype = vp
        lib.perseus_mx_job_delete.argtypes = [vp]
        lib.perseus_mx_job_delete.restype = None
        _library = lib
    return _library


if __name__ == "__main__":
    # `python -m perseus.mxnet.engine_library`: build now (setup scripts do this).
    load()
    print(library_path())
