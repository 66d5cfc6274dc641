"""PyTorch front ends of Perseus.

perseus.torch.horovod is the Horovod-compatible API (``import perseus.torch.horovod
as hvd``); perseus.torch.distributed and perseus.torch.nn.parallel are drop-ins for
torch.distributed and torch's DistributedDataParallel. Importing this package
registers the torch.distributed backend "perseus" (c10d/); nothing else is
imported here, so that each front end loads only what it uses; they load on first
attribute access.
"""

import importlib

from perseus.torch import c10d as _c10d

_c10d.register()

_SUBMODULES = ("distributed", "horovod", "nn")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module("%s.%s" % (__name__, name))
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
