"""Every Python code block a user would paste from README.md and docs/ runs as written
(issue 49, point 9: the README's `hvd.allreduce(grad, ...)` and drop-in DDP blocks and
both of docs/ddp.md's raised NameError when pasted).

The convention, for whoever writes a page:

- A ```python block runs as written. This test runs each one, pasted into a file, in
  a fresh process from an empty folder, as a world of one (a plain `python`), with
  .venv's python, or with .venv-tf's or .venv-mx's when it imports TensorFlow or
  MXNet; it must exit 0.
- A block that is part of a script says so on its first line, where the reader sees
  it: `# fragment: needs <what it leaves out>` (for example "# fragment: needs a model
  and data"). It is only compiled.
- A block that needs a GPU says so on its first line: `# needs a GPU`. It runs where
  torch sees CUDA, and is skipped elsewhere.

The blocks run two at a time, in one fixture, so the whole check costs about the
slowest few blocks' start-up (TensorFlow's import is the longest).
"""
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.jobs import REPO_ROOT, clean_env, framework_python

FRAGMENT = re.compile(r"# fragment: needs \S.*")
NEEDS_GPU = "# needs a GPU"
TIMEOUT_S = 180


def pages():
    """README.md and the site's pages (docs/investigations/ is kept out of the site)."""
    docs = REPO_ROOT / "docs"
    return [REPO_ROOT / "README.md"] + sorted(
        p for p in docs.rglob("*.md") if "investigations" not in p.parts)


def python_blocks():
    """(id, code) for every ```python block: id is page:line of the block's first line."""
    blocks = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^```(?:python|py)\n(.*?)^```", text, flags=re.S | re.M):
            line = text.count("\n", 0, m.start()) + 2
            blocks.append(("%s:%d" % (page.relative_to(REPO_ROOT), line), m.group(1)))
    return blocks


BLOCKS = python_blocks()


def kind(code):
    first = code.split("\n", 1)[0]
    if FRAGMENT.fullmatch(first):
        return "fragment"
    return "gpu" if first == NEEDS_GPU else "runs"


def interpreter(code):
    """The venv whose packages the block imports: (label, tag, setup script) or None."""
    if re.search(r"^\s*(import|from) (tensorflow|perseus\.tensorflow)\b", code, re.M):
        return ("TensorFlow", "tf", "setup_tf.sh")
    if re.search(r"^\s*(import|from) (mxnet|perseus\.mxnet)\b", code, re.M):
        return ("MXNet", "mx", "setup_mxnet.sh")
    return None


def python_for(code):
    """The block's python, or a skip or failure (from conftest) when its venv is missing."""
    framework = interpreter(code)
    return Path(sys.executable) if framework is None else framework_python(*framework)


def cuda_available():
    import torch
    return torch.cuda.is_available()


def run_block(python, code, folder):
    folder.mkdir()
    script = folder / "snippet.py"
    script.write_text(code)
    env = clean_env({"TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        return subprocess.run([str(python), str(script)], cwd=str(folder), env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, "timed out after %d s" % TIMEOUT_S,
                                           e.stdout or "", e.stderr or "")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{block id: CompletedProcess} for every block that runs here, two at a time."""
    jobs = {}
    for block_id, code in BLOCKS:
        if kind(code) == "fragment" or (kind(code) == "gpu" and not cuda_available()):
            continue
        try:
            python = python_for(code)
        except BaseException:  # its venv is missing: the block's own test says so
            continue
        folder = tmp_path_factory.mktemp("snippet") / "run"
        jobs[block_id] = (python, code, folder)
    with ThreadPoolExecutor(2) as pool:
        futures = {i: pool.submit(run_block, *job) for i, job in jobs.items()}
        return {i: f.result() for i, f in futures.items()}


def test_the_pages_have_python_blocks():
    assert len(BLOCKS) >= 8, BLOCKS  # the extraction found the README's and the guides'


@pytest.mark.parametrize("block_id, code", BLOCKS, ids=[b for b, _ in BLOCKS])
def test_python_block_runs_as_written(block_id, code, results):
    compile(code, block_id, "exec")  # a fragment must still be Python
    if kind(code) == "fragment":
        return
    if kind(code) == "gpu" and not cuda_available():
        pytest.skip("%s needs a GPU: torch sees no CUDA here" % block_id)
    python_for(code)  # skips or fails, saying why, where its venv is missing
    res = results[block_id]
    if res.returncode != 0:
        pytest.fail("%s, pasted into a file and run with %s, exited %s:\n%s%s" % (
            block_id, res.args[0], res.returncode, res.stdout, res.stderr[-3000:]), pytrace=False)


@pytest.mark.parametrize("first_line, expected", [
    ("# fragment: needs a model and data", "fragment"),
    ("# fragment:", "runs"),             # says nothing of what it needs: not a fragment
    ("# needs a GPU", "gpu"),
    ("import torch", "runs"),
])
def test_the_markers(first_line, expected):
    assert kind(first_line + "\nx = 1\n") == expected
