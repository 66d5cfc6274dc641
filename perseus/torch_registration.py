"""`import perseus` registers the torch.distributed backend "perseus", as importing
torch-ccl registers "ccl", so that init_process_group("perseus") works in a script
that imported perseus but not perseus.torch.

torch itself is not imported for it: that takes seconds, and perseusrun, setup.py and
the docs build import perseus. When torch is imported already, the backend is
registered at once (about 5 ms); otherwise a one-shot import hook registers it right
after torch's own import finishes, and costs nothing until then but a name
comparison per import.
"""

import sys
import warnings


def _register():
    try:
        import torch.distributed
        if not torch.distributed.is_available():  # a torch built without it
            return
        import perseus.torch  # noqa: F401  (its import registers the backend)
    except Exception as e:  # never break the user's `import torch` for this
        warnings.warn("Perseus could not register the torch.distributed backend \"perseus\" "
                      "(%s: %s); `import perseus.torch` says why" % (type(e).__name__, e))


class _AfterTorch:
    """A meta path finder (importlib.abc is not imported for it: it costs more than
    the rest of `import perseus`) that finds nothing itself: it hands torch's spec
    back with a loader that registers the backend once torch's module has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # one shot, and the lookup below must not find us
        import importlib.util  # torch's import is about to take seconds anyway
        spec = importlib.util.find_spec("torch")
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_torch = spec.loader.exec_module

        def exec_module(module):
            run_torch(module)
            _register()

        spec.loader.exec_module = exec_module  # this spec's own loader object
        return spec


def install():
    """Registers now if torch is imported, else when it is; once per process."""
    if "torch" in sys.modules:
        _register()
    elif not any(isinstance(finder, _AfterTorch) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())
