"""Horovod's public submodule paths on Perseus's front-end packages.

Scripts import from Horovod's submodules as well as from its packages, e.g.
``from horovod.torch.mpi_ops import synchronize, Average``; after the import change
that is ``perseus.torch.horovod.mpi_ops``. Perseus's ``horovod`` packages are flat
re-exports, so each such path is registered here as a module that holds the package's
own public objects (Horovod's submodules are where those objects live): both routes
give the same object. Where Perseus has a real module for the path (``elastic``), that
module is registered instead.
"""

import sys
import types

from perseus.common import basics, process_sets


# Horovod's mpi_ops modules hold `_basics`, the object behind init, size, rank, ...;
# tests and tools call it directly.
BASICS = types.SimpleNamespace(
    _get_process_set_ids_and_ranks=process_sets.ids_and_ranks,  # Horovod's name, same answer
    **{name: getattr(basics, name) for name in (
        "init", "shutdown", "is_initialized", "is_homogeneous", "size", "local_size",
        "cross_size", "rank", "local_rank", "cross_rank", "mpi_threads_supported",
        "mpi_enabled", "mpi_built",
        "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
        "rocm_built", "start_timeline", "stop_timeline")})


def add_submodules(package_name, flat, real=None):
    """Registers `package_name`.<name> for each name in `flat` as a module with the
    package's public objects (and `_basics`), and `package_name`.<path> for each
    {path: module} in `real` as that module. Call at the end of the package's
    __init__, once its names are bound."""
    package = sys.modules[package_name]
    public = {k: v for k, v in vars(package).items() if not k.startswith("_")}
    public["_basics"] = BASICS
    for name in flat:
        full = "%s.%s" % (package_name, name)
        module = types.ModuleType(full, "Horovod's %s submodule, on Perseus: the objects of %s."
                                  % (name, package_name))
        module.__dict__.update(public)
        sys.modules[full] = module
        setattr(package, name, module)
    for path, module in (real or {}).items():
        sys.modules["%s.%s" % (package_name, path)] = module
        if "." not in path:
            setattr(package, path, module)
