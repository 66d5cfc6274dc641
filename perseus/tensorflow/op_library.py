"""Builds (once, cached) and loads the Perseus TensorFlow op library.

The ops (csrc/perseus_tf_ops.cc) are compiled against the TensorFlow that is
installed, with its own compile and link flags, and linked to libperseus.so. A
TensorFlow build's C++ ABI is only stable within one version, so the cache key
covers the source, perseus.h, the TensorFlow version and flags, and the core
library's path: a new TensorFlow or a changed source rebuilds, anything else
loads the cached file. Ranks started together may all get here at once: a file lock lets one
build while the others wait, and the library appears by an atomic rename.

Cache: $PERSEUS_TF_OPS_CACHE, else $XDG_CACHE_HOME/perseus, else ~/.cache/perseus.
Compiler: $CXX, else g++ (C++17).
"""

import fcntl
import hashlib
import os
import shlex
import subprocess
import sys

import tensorflow as tf

from perseus.common import library as _core

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "perseus_tf_ops.cc")
# perseus.h beside the source: a symlink to csrc/include in the repository, a copy
# in an installed package (setup.py's package_data).
INCLUDE_DIR = os.path.join(os.path.dirname(SOURCE), "include")

_ops = None


def _cache_dir():
    if os.environ.get("PERSEUS_TF_OPS_CACHE"):
        return os.environ["PERSEUS_TF_OPS_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "perseus")


def _include_dir():
    if not os.path.exists(os.path.join(INCLUDE_DIR, "perseus", "perseus.h")):
        raise ImportError("cannot build the Perseus TensorFlow ops: perseus/perseus.h not found "
                          "in %s; reinstall Perseus" % INCLUDE_DIR)
    return INCLUDE_DIR


def _command(output):
    compiler = shlex.split(os.environ.get("CXX", "g++"))
    core_dir = os.path.dirname(_core.LIBRARY_PATH)
    return (compiler + ["-shared", "-fPIC", "-O2", "-std=c++17", SOURCE, "-o", output,
                        "-I" + _include_dir()]
            + tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()
            + ["-L" + core_dir, "-l:libperseus.so", "-Wl,-rpath," + core_dir])


def library_path():
    """Where the library for this TensorFlow and source lives (built or not)."""
    key = hashlib.sha256()
    # The header too: a changed perseus_request_t must never meet a stale library.
    for source in (SOURCE, os.path.join(_include_dir(), "perseus", "perseus.h")):
        with open(source, "rb") as f:
            key.update(f.read())
    key.update(" ".join(_command("")).encode())
    key.update(tf.__version__.encode())
    return os.path.join(_cache_dir(), "perseus_tf_ops-%s-%s.so"
                        % (tf.__version__, key.hexdigest()[:16]))


def build(path):
    """Compiles the op library to `path` (under a lock; no-op if another process did)."""
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
            raise ImportError("cannot build the Perseus TensorFlow ops: could not run the C++ "
                              "compiler %r (%s); install g++ or set CXX" % (command[0], e)) from e
        if result.returncode != 0:
            raise ImportError(
                "cannot build the Perseus TensorFlow ops against TensorFlow %s. Command:\n  %s\n"
                "Compiler output (last lines):\n%s"
                % (tf.__version__, " ".join(shlex.quote(c) for c in command),
                   "\n".join(result.stderr.splitlines()[-30:])))
        os.replace(tmp, path)


def load():
    """The loaded op module (tf.load_op_library), building it on first use."""
    global _ops
    if _ops is None:
        path = library_path()
        if not os.path.exists(path):
            print("perseus: building the TensorFlow ops for TensorFlow %s (once) into %s"
                  % (tf.__version__, path), file=sys.stderr)
            build(path)
        _ops = tf.load_op_library(path)
    return _ops


if __name__ == "__main__":
    # `python -m perseus.tensorflow.op_library`: build now (setup scripts do this).
    print(load() and library_path())
