#!/usr/bin/env python3
"""Checks the layers of the Python package perseus/, as scripts/check_layers.py checks
the core's: every import (at module level or inside a function) of a perseus module
must run down the layers below, or stay within its own group.

    python scripts/check_python_layers.py          # report violations; exit 1 if any
    python scripts/check_python_layers.py --order  # print the layers
    python scripts/check_python_layers.py --root R # check R/perseus instead

The layers, lowest first. A group may import its own modules and any lower layer's;
the groups of one layer are siblings and never import each other (DESIGN.md: "Faces
are siblings"): the torch faces share only the operations layer below them.
"""
import ast
import fnmatch
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (layer, {group: module patterns}), lowest first. Patterns are dotted module names
# with fnmatch wildcards; the first group that matches a module is its group.
LAYERS = [
    ("common", {"common": ["perseus.common", "perseus.common.*", "perseus.lib", "perseus.lib.*"]}),
    ("torch base", {"torch base": ["perseus.torch.adapter", "perseus.torch.device",
                                   "perseus.torch.keepalive", "perseus.torch.buckets"]}),
    ("torch operations", {"torch operations": ["perseus.torch.ops", "perseus.torch.ops.*"]}),
    ("faces", {
        "torch: Horovod's API": ["perseus.torch.mpi_ops", "perseus.torch.autograd_ops",
                                 "perseus.torch.functions", "perseus.torch.optimizer",
                                 "perseus.torch.optimizer_mixin", "perseus.torch.grad_buckets",
                                 "perseus.torch.adasum_optimizer", "perseus.torch.sync_batch_norm",
                                 "perseus.torch.compression", "perseus.torch.elastic",
                                 "perseus.torch.elastic_sampler", "perseus.torch.horovod",
                                 "perseus.torch.horovod.*"],
        "torch: the drop-in": ["perseus.torch.distributed", "perseus.torch.distributed.*",
                               "perseus.torch.nn", "perseus.torch.nn.*"],
        "torch: the c10d backend": ["perseus.torch.c10d", "perseus.torch.c10d.*"],
        "tensorflow": ["perseus.tensorflow", "perseus.tensorflow.*"],
        "mxnet": ["perseus.mxnet", "perseus.mxnet.*"],
    }),
    # perseus.torch's own __init__ registers the backend; perseus/__init__.py and the
    # tools (perseusrun, check_build, ...) sit on everything.
    ("entry points", {"entry points": ["perseus", "perseus.torch", "perseus.*"]}),
]


def group_of(module):
    """(layer index, group name) of a dotted perseus module name."""
    for index, (_, groups) in enumerate(LAYERS):
        for group, patterns in groups.items():
            if any(fnmatch.fnmatchcase(module, p) for p in patterns):
                return index, group
    raise ValueError("%s is in no layer of scripts/check_python_layers.py" % module)


def module_name(path, root):
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path, module, root):
    """(line, imported perseus module) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule when there is one; the package
            # counts only for a name that is no submodule (an attribute of it).
            names = []
            for alias in node.names:
                candidate = "%s.%s" % (base, alias.name)
                names.append(candidate if _exists(candidate, root) else base)
        else:
            continue
        found.extend((node.lineno, n) for n in names if n == "perseus" or n.startswith("perseus."))
    return found


def _exists(module, root):
    path = root.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def violations(root=ROOT):
    found = []
    for path in sorted((root / "perseus").rglob("*.py")):
        if "csrc" in path.parts:
            continue
        module = module_name(path, root)
        layer, group = group_of(module)
        for line, imported in imports_of(path, module, root):
            if imported == "perseus" or not _exists(imported, root):
                continue
            their_layer, their_group = group_of(imported)
            if their_group == group or their_layer < layer:
                continue
            why = ("a sibling (%s)" % their_group if their_layer == layer
                   else "a higher layer (%s)" % LAYERS[their_layer][0])
            found.append("%s:%d: %s (%s) imports %s, %s"
                         % (path.relative_to(root), line, module, group, imported, why))
    return found


def main(argv):
    if "--order" in argv:
        for name, groups in LAYERS:
            print("%s: %s" % (name, "; ".join(groups)))
        return 0
    root = Path(argv[argv.index("--root") + 1]) if "--root" in argv else ROOT
    found = violations(root)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
