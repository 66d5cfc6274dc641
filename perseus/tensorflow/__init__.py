"""TensorFlow front ends of Perseus.

perseus.tensorflow.horovod is Horovod's TensorFlow API (``import
perseus.tensorflow.horovod as hvd``); perseus.tensorflow.keras is Horovod's Keras
API. Nothing is imported here: each loads TensorFlow (and builds the op library
on first use) only when used.
"""

import importlib

_SUBMODULES = ("horovod", "keras")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module("%s.%s" % (__name__, name))
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
