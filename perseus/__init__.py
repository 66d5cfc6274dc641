"""Perseus: a Horovod-compatible data-parallel library.

This module stays lightweight on purpose: importing ``perseus`` must not load the
core library or any framework, so tools (setup.py, docs, launchers) can read the
version without a built libperseus. Framework front ends live in subpackages,
e.g. ``import perseus.torch.horovod as hvd``.
"""

__version__ = "0.1.0"
