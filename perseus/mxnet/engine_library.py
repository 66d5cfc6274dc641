"""Builds (once, cached: perseus.common.native_build) and loads the bridge between
MXNet's engine and the core.

csrc/perseus_mx_engine.cc uses no MXNet header or library (the MXNet functions it
calls arrive as pointers), so one build serves every MXNet version; it links
libperseus.so. Cache: $PERSEUS_MX_OPS_CACHE, else $XDG_CACHE_HOME/perseus, else
~/.cache/perseus.
"""

import ctypes
import os

from perseus.common.native_build import CachedBuild

_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
SOURCE = os.path.join(_CSRC, "perseus_mx_engine.cc")
INCLUDE_DIR = os.path.join(_CSRC, "include")  # perseus/perseus.h (a symlink in the tree)

_library = None
_BUILD = CachedBuild("the Perseus MXNet engine bridge", SOURCE, INCLUDE_DIR,
                     "PERSEUS_MX_OPS_CACHE", "perseus_mx_engine")


def load():
    """The bridge as a ctypes.CDLL with its signatures declared (built on first use)."""
    global _library
    if _library is None:
        lib = ctypes.CDLL(_BUILD.ensure())
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
    print(_BUILD.path())
