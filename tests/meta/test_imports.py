"""No import cycles in perseus/, and every module imports on its own.

1. Static: the graph of perseus-internal imports of every module under perseus/
   (TensorFlow and MXNet ones included: no framework is needed to read them),
   with imports inside functions counted too, has no cycle.
2. Dynamic: every module imports in a process where no perseus module was
   imported before (a child forked from this test after it imported the
   frameworks, so torch loads once). Modules of a framework that is not
   installed here (tensorflow, mxnet in the torch venv) are skipped.
"""
import ast
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "perseus")


def _modules():
    """Dotted module name -> file, for every .py under perseus/."""
    modules = {}
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                modules[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return modules


def _imports(name, path, modules):
    """The perseus modules `name` imports, anywhere in its file."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                # `from package import module` imports the module, else the package.
                target = base + "." + alias.name
                found.add(target if target in modules else base)
    return {m for m in found if m in modules and m != name}


def _cycles(graph):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def test_no_import_cycles():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "perseus.common.builder" in graph
    cycles = _cycles(graph)
    assert not cycles, "import cycles in perseus/: %s" % "; ".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_sees_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


_FRAMEWORKS = {"perseus.torch": "torch", "perseus.tensorflow": "tensorflow",
               "perseus.keras": "tensorflow", "perseus.mxnet": "mxnet"}


def _installed(framework):
    # origin None: only a namespace package, e.g. this folder's tests/tensorflow.
    spec = importlib.util.find_spec(framework)
    return spec is not None and spec.origin is not None


def _framework(module):
    for prefix, framework in _FRAMEWORKS.items():
        if module == prefix or module.startswith(prefix + "."):
            return framework
    return None


def test_each_module_imports_alone():
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    present = {f for f in set(_FRAMEWORKS.values()) if _installed(f)}
    loaded = [m for m in sys.modules if m == "perseus" or m.startswith("perseus.")]
    for framework in sorted(present):
        __import__(framework)  # once, here: the children inherit it
    failures, checked = [], 0
    for module in sorted(_modules()):
        if _framework(module) not in present | {None}:
            continue
        checked += 1
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: forget perseus, import one module, report
            os.close(read)
            for name in loaded:
                sys.modules.pop(name, None)
            status = 0
            try:
                importlib.import_module(module)
            except BaseException as e:  # noqa: B902 - reported to the parent
                os.write(write, ("%s: %s" % (type(e).__name__, e)).encode()[:4000])
                status = 1
            os._exit(status)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            message = pipe.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        if status:
            failures.append("%s: %s" % (module, message or "exit status %d" % status))
    assert checked > 10
    assert not failures, "\n".join(failures)
