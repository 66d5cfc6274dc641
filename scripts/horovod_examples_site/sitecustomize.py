"""Environment workarounds for scripts/run_horovod_examples.py, on PYTHONPATH only in the
examples it runs; nothing here is part of Perseus, and the examples never call into it.

1. PERSEUS_EXAMPLES_TORCHVISION_SCHEMAS=1 (the runner sets it when `import torchvision`
   fails): torchvision's PyPI wheels link CUDA torch, so with a CPU torch its C++ ops do not
   load and its import fails registering fake kernels for torchvision::nms and ::qnms. We
   define those two schemas first; the examples use neither op.
2. PERSEUS_EXAMPLES_DATA=<dir>: Keras's and torchvision's loaders compare a dataset file
   already on disk with the real data's hash and download again on a mismatch (there is no
   network here). Files under <dir>, the runner's synthetic data, pass that check.
"""
import importlib.abc
import importlib.util
import os
import sys

TORCHVISION_OPS = {
    "torchvision::nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "torchvision::qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


def define_torchvision_schemas(_module=None):
    import torch.library
    for name, schema in TORCHVISION_OPS.items():
        torch.library.define(name, schema)


def is_synthetic(path):
    data = os.environ.get("PERSEUS_EXAMPLES_DATA")
    return bool(data) and os.path.realpath(str(path)).startswith(os.path.realpath(data) + os.sep)


def accept_synthetic(module, checker):
    """Wrap module.<checker>(path, ...) so that it passes files under PERSEUS_EXAMPLES_DATA."""
    original = getattr(module, checker)

    def check(fpath, *args, **kwargs):
        return is_synthetic(fpath) or original(fpath, *args, **kwargs)

    setattr(module, checker, check)


# module name -> (run before its code, run after it); each gets the module.
HOOKS = {
    "tf_keras.src.utils.data_utils": (None, lambda m: accept_synthetic(m, "validate_file")),
    "keras.src.utils.file_utils": (None, lambda m: accept_synthetic(m, "validate_file")),
    "torchvision.datasets.cifar": (None, lambda m: accept_synthetic(m, "check_integrity")),
}
if os.environ.get("PERSEUS_EXAMPLES_TORCHVISION_SCHEMAS") == "1":
    HOOKS["torchvision"] = (define_torchvision_schemas, None)


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader, before, after):
        self.loader, self.before, self.after = loader, before, after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        if self.before:
            self.before(module)
        self.loader.exec_module(module)
        if self.after:
            self.after(module)


class _HookFinder(importlib.abc.MetaPathFinder):
    """Finds HOOKS' modules with the other finders and wraps their loaders."""

    def find_spec(self, name, path=None, target=None):
        if name not in HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _HookedLoader(spec.loader, *HOOKS[name])
                return spec
        return None


sys.meta_path.insert(0, _HookFinder())
