"""Comments, docstrings and docs point at files that exist.

A comment that names a file which was moved or renamed sends the reader nowhere. Read
here: the comments of the C/C++/CUDA and shell sources, the comments and docstrings of
the Python sources, and the text of README.md and docs/*.md. A path with a folder
(`cuda/device_runner.cc`, `tests/rank_scripts/common.py`) must exist from the repository
root, the file's own folder, csrc/src/ (the core's include root) or csrc/include/; a
bare source file name (`keepalive.py`) must be the name of some file in the repository,
unless it is one of the outside files in OUTSIDE.
"""
import io
import os
import re
import tokenize
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".venv", ".venv-tf", ".venv-mx", ".venv-gpu", "build", ".git", "__pycache__",
             "investigations", ".cache", "wheels", ".pytest_cache"}
SOURCE_SUFFIXES = {".py", ".h", ".cc", ".cu", ".c", ".sh"}
# Where a path with a folder may start: the repository's folders, and the core's layers
# (as its #include lines name them, from csrc/src/).
ROOTS = ("csrc/", "perseus/", "tests/", "scripts/", "benchmarks/", "docs/", "examples/",
         "patches/", "build_support/", "bin/", "cuda/", "common/", "engine/", "lanes/",
         "lane_api/", "mpi/", "collectives/", "kernels/")
# Bare names of files that are not ours: other projects' headers, the user's script in
# usage lines, a file that only a GPU machine's shared folder holds.
OUTSIDE = {"mpi.h", "nccl.h", "cuda_runtime_api.h", "driver_types.h", "train.py",
           "check_multi_rank.py", "name.py",
           "mpi-ext.h",  # Open MPI's
           "pmix_server_dyn.c",  # PRRTE's, named in its error lines
           "mpi_ops_v2.cc", "tensorflow2_keras_synthetic_benchmark.py", "launch.py"}  # Horovod's
PATH = re.compile(r"(?<![\w/.$<{*-])((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:h|cc|cu|c|inc|py|sh|md))"
                  r"(?![\w/(])")


def python_comments(text):
    """(line, text) of the comments and docstrings (strings that stand as statements)."""
    out = []
    before = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and before in (tokenize.NEWLINE, tokenize.INDENT,
                                                        tokenize.DEDENT):
            out += [(tok.start[0] + k, l) for k, l in enumerate(tok.string.splitlines())]
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            before = tok.type
    return out


def c_comments(text):
    out = []
    for m in re.finditer(r"//[^\n]*|/\*.*?\*/", text, flags=re.S):
        first = text.count("\n", 0, m.start()) + 1
        out += [(first + k, l) for k, l in enumerate(m.group(0).splitlines())]
    return out


def shell_comments(text):
    return [(i + 1, l[l.index("#"):]) for i, l in enumerate(text.splitlines()) if "#" in l]


def commented_text(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".md":
        return list(enumerate(text.splitlines(), 1))
    if path.suffix == ".py":
        return python_comments(text)
    if path.suffix == ".sh":
        return shell_comments(text)
    return c_comments(text)


def our_files(root):
    """Every file of the checkout outside SKIP_DIRS and the virtual environments (which
    setup makes beside the sources: .venv, .venv-tf, .venv-ompi5, ...)."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(".venv"))
        for name in sorted(files):
            yield Path(folder) / name


def files_to_read(root):
    for path in our_files(root):
        rel = path.relative_to(root)
        if path.suffix in SOURCE_SUFFIXES or (path.suffix == ".md" and (
                rel.parts[0] == "docs" or rel.name == "README.md")):
            yield path


def stale_paths(root):
    """'file:line: path' for each path a comment names that exists nowhere."""
    names = {p.name for p in our_files(root)}
    found = []
    for path in files_to_read(root):
        for line, text in commented_text(path):
            for ref in PATH.findall(text):
                if "/" in ref:
                    if not ref.startswith(ROOTS):
                        continue  # another project's path (include/mxnet/engine.h)
                    bases = [root, path.parent, root / "csrc" / "src", root / "csrc" / "include"]
                    ok = any((base / ref).exists() for base in bases)
                else:
                    ok = ref in names or ref in OUTSIDE or Path(ref).suffix not in SOURCE_SUFFIXES
                if not ok:
                    found.append("%s:%d: %s" % (path.relative_to(root), line, ref))
    return found


def test_comments_and_docs_name_files_that_exist():
    stale = stale_paths(REPO_ROOT)
    assert not stale, "comments naming files that do not exist:\n" + "\n".join(stale)


def test_a_stale_path_is_found_with_its_file_and_line(tmp_path):
    (tmp_path / "csrc" / "src" / "cuda").mkdir(parents=True)
    (tmp_path / "csrc" / "src" / "cuda" / "runner.cc").write_text("")
    (tmp_path / "csrc" / "src" / "cuda" / "a.h").write_text(
        "// See cuda/runner.cc and kernels/gone.cu.\n/* and\n   cuda/lane.cc */\n")
    (tmp_path / "perseus").mkdir()
    (tmp_path / "perseus" / "m.py").write_text(
        '"""Keeps tensors alive (see hold.py)."""\nX = "hold.py"  # tests/rank_scripts/x.py\n')
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("Run `tests/mpi/common.py`; see cuda/runner.cc.\n")
    assert stale_paths(tmp_path) == [
        "csrc/src/cuda/a.h:1: kernels/gone.cu",
        "csrc/src/cuda/a.h:3: cuda/lane.cc",
        "docs/page.md:1: tests/mpi/common.py",
        "perseus/m.py:1: hold.py",
        "perseus/m.py:2: tests/rank_scripts/x.py",
    ]
