"""Builds (once, cached: perseus.common.native_build) and loads the Perseus
TensorFlow op library.

The ops (csrc/perseus_tf_ops.cc) are compiled against the TensorFlow that is
installed, with its own compile and link flags, and linked to libperseus.so. A
TensorFlow build's C++ ABI is only stable within one version, so the version is in
the file name and its flags in the cache key: a new TensorFlow or a changed source
rebuilds, anything else loads the cached file.

Cache: $PERSEUS_TF_OPS_CACHE, else $XDG_CACHE_HOME/perseus, else ~/.cache/perseus.
"""

import os

import tensorflow as tf

from perseus.common.native_build import CachedBuild

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "perseus_tf_ops.cc")
# perseus.h beside the source: a symlink to csrc/include in the repository, a copy
# in an installed package (setup.py's package_data).
INCLUDE_DIR = os.path.join(os.path.dirname(SOURCE), "include")

_ops = None
_BUILD = CachedBuild("the Perseus TensorFlow ops against TensorFlow %s" % tf.__version__,
                     SOURCE, INCLUDE_DIR, "PERSEUS_TF_OPS_CACHE",
                     "perseus_tf_ops-%s" % tf.__version__,
                     tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags())


def library_path():
    """Where the library for this TensorFlow and source lives (built or not)."""
    return _BUILD.path()


def load():
    """The loaded op module (tf.load_op_library), building it on first use."""
    global _ops
    if _ops is None:
        _ops = tf.load_op_library(_BUILD.ensure())
    return _ops


if __name__ == "__main__":
    # `python -m perseus.tensorflow.op_library`: build now (setup scripts do this).
    print(load() and library_path())
