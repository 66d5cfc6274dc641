"""Perseus: a Horovod-compatible data-parallel library.

This module stays lightweight on purpose: importing ``perseus`` must not load the
core library or any framework, so tools (setup.py, docs, launchers) can read the
version without a built libperseus. Framework front ends live in subpackages,
e.g. ``import perseus.torch.horovod as hvd``; they also load on first attribute
access, so ``import perseus`` then ``perseus.torch.nn.parallel.DistributedDataParallel``
works as in a torch script. Importing it registers the torch.distributed backend
"perseus" once torch is imported, without importing torch (torch_registration.py).
"""

import importlib

from perseus import torch_registration as _torch_registration

__version__ = "0.1.0"

_torch_registration.install()

_SUBPACKAGES = ("torch", "tensorflow", "keras")


def __getattr__(name):
    if name in _SUBPACKAGES:
        return importlib.import_module("%s.%s" % (__name__, name))
    if name == "run":  # Horovod's horovod.run, for `import perseus as horovod`
        return importlib.import_module("%s.func_runner" % __name__).run
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
