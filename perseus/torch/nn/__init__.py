"""perseus.torch.nn: drop-in replacements for parts of torch.nn.

``perseus.torch.nn.parallel.DistributedDataParallel`` replaces torch's. Submodules
load on first attribute access, so ``import perseus`` stays light.
"""

import importlib

_SUBMODULES = ("parallel",)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module("%s.%s" % (__name__, name))
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
