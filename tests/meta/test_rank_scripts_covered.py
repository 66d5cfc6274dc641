"""Every rank script in tests/rank_scripts, tests/tensorflow and tests/mxnet is run by some test.

A script that no test runs looks like coverage and is none. The test modules name
their scripts in two ways, both read here from each tests/test_*.py:
- run_mpi(script, ..., scripts_dir=...) or run_mpi_batch (conftest.py), whose test
  runs the script alone when its batch did not see it through: the script is a literal, an
  expression of the module's globals, or a parametrize argument of the test (its
  values taken from the test's own marks, so lists built by functions count too);
- a path to the file, `<scripts dir> / "name.py"`, for the jobs that are meant to
  fail and run without run_mpi (tests/mpi/test_failures.py).
A run_mpi call whose script cannot be resolved fails this test too: a new way of
naming scripts must be taught here rather than hide an unrun one.

HELPERS lists the modules the scripts import and no test runs; each must be imported
by a script of its directory, so the list cannot keep a name that is no longer a helper.
"""
import ast
import builtins
import importlib
import itertools
import sys
from pathlib import Path

import pytest

from support.jobs import RANK_SCRIPTS, TESTS_DIR

SCRIPT_DIRS = [RANK_SCRIPTS, TESTS_DIR / "tensorflow", TESTS_DIR / "mxnet"]

# Imported by the rank scripts, never run on their own.
HELPERS = {
    RANK_SCRIPTS / "common.py": "init, references and checks shared by the torch scripts",
    RANK_SCRIPTS / "gpu_torch_common.py": "the torch CUDA scripts' GPU and stream helpers",
    RANK_SCRIPTS / "complex_checks.py": "complex tensors through the drop-in and the backend alike",
    RANK_SCRIPTS / "tensor_write_checks.py": "what collectives do to the tensors they write, "
                                             "drop-in and backend alike",
    TESTS_DIR / "tensorflow" / "common.py": "init and checks shared by the TensorFlow scripts",
    TESTS_DIR / "tensorflow" / "tiny_model.py": "the small Keras model the TensorFlow scripts train",
    TESTS_DIR / "mxnet" / "common.py": "init and checks shared by the MXNet scripts",
}

RUN_MPI_PARAMS = ["script", "np", "env", "timeout", "python", "scripts_dir", "launcher"]
PARAMETER_SET = type(pytest.param(None))


def rank_scripts():
    return sorted(path for d in SCRIPT_DIRS for path in d.glob("*.py"))


def suite_files():
    """The test modules, this one left out (its HELPERS name scripts it does not run)."""
    return sorted(p for p in TESTS_DIR.glob("*/test_*.py") if p.name != Path(__file__).name)


def parametrize_rows(marks, names):
    """The rows of values that `names` take under the parametrize marks: one dict per
    test case (the product across marks, aligned within one)."""
    per_mark = []
    for mark in marks:
        if mark.name != "parametrize":
            continue
        argnames = mark.args[0] if mark.args else mark.kwargs["argnames"]
        if isinstance(argnames, str):
            argnames = [n.strip() for n in argnames.split(",") if n.strip()]
        wanted = [n for n in argnames if n in names]
        if not wanted:
            continue
        argvalues = mark.args[1] if len(mark.args) > 1 else mark.kwargs["argvalues"]
        rows = []
        for value in argvalues:
            values = value.values if isinstance(value, PARAMETER_SET) else value
            if len(argnames) == 1 and not isinstance(value, PARAMETER_SET):
                values = (value,)
            rows.append({n: values[argnames.index(n)] for n in wanted})
        per_mark.append(rows)
    return [{k: v for row in combo for k, v in row.items()} for combo in itertools.product(*per_mark)]


def free_names(expr, namespace):
    return {node.id for node in ast.walk(expr)
            if isinstance(node, ast.Name) and node.id not in namespace and not hasattr(builtins, node.id)}


def evaluate(expr, namespace, marks):
    """The values `expr` takes across the test's cases, or None where a name in it is
    neither a global of the module nor a parametrize argument of the test."""
    code = compile(ast.Expression(expr), "<run_mpi argument>", "eval")
    names = free_names(expr, namespace)
    rows = parametrize_rows(marks, names) if names else [{}]
    if any(set(row) != names for row in rows) or not rows:
        return None
    return [eval(code, dict(namespace), row) for row in rows]


def argument(call, name):
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    index = RUN_MPI_PARAMS.index(name)
    return call.args[index] if len(call.args) > index else None


def functions_with_marks(module, tree):
    """(function node, its pytest marks) for each function and method at the top of the module."""
    module_marks = getattr(module, "pytestmark", [])
    module_marks = module_marks if isinstance(module_marks, list) else [module_marks]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, module_marks + getattr(getattr(module, node.name, None), "pytestmark", [])
        elif isinstance(node, ast.ClassDef):
            cls = getattr(module, node.name, None)
            cls_marks = getattr(cls, "pytestmark", [])
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield item, (module_marks + cls_marks
                                 + getattr(getattr(cls, item.name, None), "pytestmark", []))


def scripts_named_by(path):
    """-> (the script files the test module runs, the run_mpi calls it could not resolve)."""
    if str(path.parent) not in sys.path:  # as pytest imports it (rootdir-less "prepend" mode)
        sys.path.insert(0, str(path.parent))
    module = importlib.import_module(path.stem)
    tree = ast.parse(path.read_text(), str(path))
    namespace = vars(module)
    run, unresolved = set(), []
    for function, marks in functions_with_marks(module, tree):
        for call in ast.walk(function):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                    and call.func.id in ("run_mpi", "run_mpi_batch")):
                continue
            where = "%s:%d: %s" % (path.name, call.lineno, ast.unparse(call))
            script_expr, dir_expr = argument(call, "script"), argument(call, "scripts_dir")
            scripts = evaluate(script_expr, namespace, marks) if script_expr else None
            dirs = evaluate(dir_expr, namespace, marks) if dir_expr else [RANK_SCRIPTS]
            if scripts is None or dirs is None:
                unresolved.append(where)
                continue
            run.update(Path(d) / ("%s.py" % s) for s in scripts for d in dirs)
    for node in ast.walk(tree):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                and isinstance(node.right, ast.Constant) and str(node.right.value).endswith(".py")):
            try:
                folder = eval(compile(ast.Expression(node.left), "<path>", "eval"), dict(namespace))
            except NameError:
                continue  # a local folder: not one of the script directories here
            run.add(Path(folder) / node.right.value)
    return run, unresolved


def imported_modules(folder):
    names = set()
    for script in folder.glob("*.py"):
        for node in ast.walk(ast.parse(script.read_text(), str(script))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
    return names


def test_every_rank_script_is_run_by_a_test():
    run, unresolved = set(), []
    for path in suite_files():
        found, lost = scripts_named_by(path)
        run |= {p.resolve() for p in found}
        unresolved += lost
    assert not unresolved, ("run_mpi calls whose script this check cannot tell (use a literal, a "
                            "module global or a parametrize argument):\n  " + "\n  ".join(unresolved))
    never_run = [str(p.relative_to(TESTS_DIR)) for p in rank_scripts()
                 if p.resolve() not in run and p not in HELPERS]
    assert not never_run, ("rank scripts that no test runs (run them with run_mpi in a test, or list "
                           "them in HELPERS if scripts only import them):\n  " + "\n  ".join(never_run))
    helpers_run = [str(p.relative_to(TESTS_DIR)) for p in HELPERS if p.resolve() in run]
    assert not helpers_run, "listed in HELPERS but run by a test: %s" % helpers_run


def test_helpers_are_imported_by_the_scripts():
    for helper in HELPERS:
        assert helper.exists(), "HELPERS names %s, which does not exist" % helper
        assert helper.stem in imported_modules(helper.parent), (
            "HELPERS names %s, which no script in %s imports" % (helper.name, helper.parent.name))
