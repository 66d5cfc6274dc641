"""The documentation: the site under docs/ builds with MkDocs in strict mode (a broken
link or anchor fails it) and its API reference lists the public modules' names, with
no internal alias shown as a value; benchmarks/README.md is a page of the site; its
tables wrap; the README's links land on pages and anchors that exist; .ci/run runs the
README's test command; every command a user would copy from the README or docs/ names
programs, scripts and flags that exist (MkDocs as .venv has it); and the configuration
table in docs/configuration.md is the core's table (csrc/src/engine/config.cc).
The Python blocks of the pages run: tests/meta/test_doc_snippets.py."""
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.doc_text import (DOCS, LAUNCHERS, PYTHONS, README, REPO_ROOT, commands_in, sh_blocks,
                              simple_commands, user_pages, words)
from support.jobs import skip_unless_possible


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once with `mkdocs build --strict` into a temporary folder."""
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError:
        skip_unless_possible("mkdocs is not installed (bash scripts/setup.sh --all installs it)")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                             str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def ids_of(html_file):
    return set(re.findall(r'\bid="([^"]+)"', html_file.read_text(encoding="utf-8")))


def page_html(site, md_path):
    """The built HTML of docs/<md_path> (MkDocs' directory URLs)."""
    rel = md_path.relative_to(DOCS).with_suffix("")
    return site / ("index.html" if rel.name == "index" else rel / "index.html")


# One name per module that its page must document: the API reference is generated,
# not an empty page (a module whose names griffe cannot see renders only a title).
API_PAGES = {
    "api/torch-horovod.md": ["perseus.torch.horovod.allreduce_async_",
                             "perseus.torch.horovod.DistributedOptimizer",
                             "perseus.torch.horovod.synchronize"],
    "api/torch-distributed.md": ["perseus.torch.distributed.init_process_group",
                                 "perseus.torch.distributed.all_reduce"],
    "api/torch-ddp.md": ["perseus.torch.nn.parallel.DistributedDataParallel"],
    "api/tensorflow-horovod.md": ["perseus.tensorflow.horovod.DistributedGradientTape",
                                  "perseus.tensorflow.horovod.allreduce"],
    "api/mxnet.md": ["perseus.mxnet.DistributedTrainer", "perseus.mxnet.allreduce_"],
    "api/perseusrun.md": ["perseus.launcher.main"],
}


def test_site_builds_strict_with_the_api_reference(site):
    for page, names in API_PAGES.items():
        ids = ids_of(page_html(site, DOCS / page))
        missing = [n for n in names if n not in ids]
        assert not missing, "%s documents none of %s" % (page, missing)


def page_text(html_file):
    """The visible text of a built page, roughly: tags dropped, spaces folded."""
    text = re.sub(r"<[^>]+>", " ", html_file.read_text(encoding="utf-8"))
    return " ".join(html.unescape(text).split())


def test_api_pages_show_no_internal_alias(site):
    """`poll = _adapter.poll` headed the torch page, an attribute showing its internal
    value; such names are the functions they name (docs/hooks/module_aliases.py)."""
    for page in API_PAGES:
        text = page_text(page_html(site, DOCS / page))
        assert not re.findall(r"\b\w+ = _\w+\.\w+", text), page
    text = page_text(page_html(site, DOCS / "api/torch-horovod.md"))
    assert re.search(r"\bpoll ?\( ?handle ?\)", text) and re.search(r"\bsynchronize ?\( ?handle", text)


def test_benchmarks_readme_is_a_page_of_the_site(site):
    """benchmarks/README.md, cited by the pages, is the page benchmarks.md (made by
    docs/hooks/benchmarks_page.py), in the navigation; every page that names it links it."""
    built = page_html(site, DOCS / "benchmarks.md")
    assert built.exists()
    readme = (REPO_ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    title = re.search(r"^# (.+)$", readme, re.M).group(1)
    assert title in page_text(built)
    assert 'href="benchmarks/"' in (site / "index.html").read_text(encoding="utf-8")
    links = re.compile(r"\[[^\]]*\]\([^)]*\)")
    unlinked = [str(p.relative_to(REPO_ROOT)) for p in user_pages()[1:]
                if "benchmarks/README.md" in links.sub("", p.read_text(encoding="utf-8"))]
    assert not unlinked, "pages naming benchmarks/README.md without a link: %s" % unlinked


def test_wide_tables_wrap(site):
    """The theme kept table headers on one line and broke code only at spaces, so a
    long name in a table ran past the page; docs/css/tables.css wraps cells anywhere.
    (No browser here: this checks that every page loads the rules that do it.)"""
    css = (DOCS / "css" / "tables.css").read_text()
    rules = dict(re.findall(r"([^{}]+)\{([^}]*)\}", re.sub(r"/\*.*?\*/", "", css, flags=re.S)))
    wraps = [sel for sel, body in rules.items() if "overflow-wrap: anywhere" in body]
    assert any("td" in sel and "code" in sel for sel in wraps), rules
    assert any("thead" in sel and "white-space: normal" in body for sel, body in rules.items())
    pages = list(site.rglob("index.html"))
    assert len(pages) > 20
    for page in pages:
        assert re.search(r'href="[./]*css/tables\.css"', page.read_text(encoding="utf-8")), page


def test_the_docs_build_command_is_the_readmes():
    """The README gives the command that builds the site, with .venv's MkDocs and its
    pins (`mkdocs build` alone was "command not found"); setup.sh --all installs them."""
    readme = README.read_text(encoding="utf-8")
    command = ".venv/bin/pip install -r docs/requirements.txt && .venv/bin/mkdocs build --strict"
    assert command in [b.strip() for b in sh_blocks(readme)]
    pins = (DOCS / "requirements.txt").read_text()
    assert re.search(r"^mkdocs==[\d.]+$", pins, re.M), pins
    assert "-r docs/requirements.txt" in (REPO_ROOT / "scripts" / "setup.sh").read_text()


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_links_land_on_pages_and_anchors_that_exist(site):
    """MkDocs checks the pages' links; the README is outside the site, so here."""
    bad = []
    for target in LINK.findall(README.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (REPO_ROOT / path) if path else README
        if not file.exists():
            bad.append("%s: no file %s" % (target, path))
        elif anchor and file.suffix == ".md" and DOCS in file.parents:
            if anchor not in ids_of(page_html(site, file)):
                bad.append("%s: no anchor #%s on that page" % (target, anchor))
        elif anchor:
            bad.append("%s: an anchor into a file outside docs/ cannot be checked" % target)
    assert not bad, bad


def test_ci_runs_the_readme_test_command_from_the_quick_start():
    """.ci/run runs exactly the README's "Run the tests" command, which stays in the
    README's Quick start, in a block a newcomer copies."""
    ci = [l for l in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
          if l.strip() and not l.startswith("#")]
    command = ci[-1].strip()
    assert command == "bash scripts/setup.sh --all && .venv/bin/python -m pytest -q"
    readme = README.read_text(encoding="utf-8")
    quick_start = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b.strip() for b in sh_blocks(quick_start)]
    assert command in blocks, blocks
    assert "bash scripts/setup.sh && .venv/bin/mpirun -np 2 ./train.sh" in blocks, blocks


# ---- the commands in the docs --------------------------------------------------------
# Programs a command may start with that are not in this repository (the system's, MPI's,
# pip's, a placeholder for the user's own script): only their being named is checked.
# A bare `mkdocs` is not one: MkDocs is in .venv only ("command not found" otherwise).
EXTERNAL = {"apt-get", "git", "module", "readelf", "grep", "export", "source", ".", "srun",
            "mpicxx", "pip", "pip3", "cd", "sbatch", "$CAFFE", "which", "mktemp",
            "train.py"}
VENV_PROGRAMS = {"python", "pip", "mpirun", "perseusrun", "mkdocs"}
REPO_DIRS = ("scripts/", "examples/", "benchmarks/", "patches/", "tests/", "docs/", "perseus/",
             "csrc/", "build_support/", "bin/")


def flag_text(script):
    """The text a script's --flags must appear in: the script and the examples it names
    (train.sh passes its arguments to examples/pytorch/*.py)."""
    text = script.read_text(encoding="utf-8", errors="replace")
    for name in set(re.findall(r"examples/[\w/]+\.py", text)):
        if (REPO_ROOT / name).exists():
            text += (REPO_ROOT / name).read_text(encoding="utf-8", errors="replace")
    return text


def check_flags(script, tokens):
    text = flag_text(script)
    return ["%s has no option %s" % (script.relative_to(REPO_ROOT), t.split("=")[0])
            for t in tokens if t.startswith("--") and not mentions(text, t.split("=")[0])]


def mentions(text, option):
    """Whether `text` has `option` as a whole word (--repeat is not --repeats)."""
    return re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(option), text) is not None


def check_paths(tokens):
    problems = []
    for t in tokens:
        path = t.split("=", 1)[-1].replace("$PWD/", "")
        if path.startswith(REPO_DIRS) and not (REPO_ROOT / path).exists():
            if not path.startswith("docs/figures/"):  # an output the command writes
                problems.append("no file %s" % path)
    return problems


def check_command(tokens):
    """Problems with one simple command's program, repo paths and options."""
    if not tokens:
        return []
    program, rest = tokens[0], tokens[1:]
    if re.match(r"^/usr/bin/python3?$", program):
        program = Path(program).name
    venv = re.match(r"^(\.venv[-\w]*|\$deb)/bin/(\w+)$", program)
    if venv:
        if venv.group(2) not in VENV_PROGRAMS:
            return ["%s is not a program the venvs have" % program]
        program = venv.group(2)
        if program in ("pip", "mkdocs"):
            return check_paths(rest)
    problems = check_paths(rest)
    if program in LAUNCHERS:
        if program == "perseusrun":
            # Its own options and horovodrun's (launcher_flags.py).
            launcher = "".join((REPO_ROOT / "perseus" / name).read_text()
                               for name in ("launcher.py", "launcher_flags.py"))
            opts = [t for t in rest if t.startswith("-")]
            problems += ["perseusrun has no option %s" % t for t in opts
                         if t.startswith("--") and t != "--help" and not mentions(launcher, t)]
        for i, t in enumerate(rest):  # the launched command: the first program word
            if t in PYTHONS | {"./train.sh"} or re.match(r"^(\.venv[-\w]*/bin/|\$)", t):
                return problems + check_command(rest[i:])
        return problems
    if program in PYTHONS:
        if rest[:1] == ["-m"]:
            module = rest[1]
            if module.startswith("perseus"):
                path = REPO_ROOT / (module.replace(".", "/") + ".py")
                if not path.exists():
                    problems.append("no module %s" % module)
            return problems
        script = REPO_ROOT / rest[0] if rest else None
        if script is not None and script.suffix == ".py" and script.exists():
            problems += check_flags(script, rest[1:])
        return problems
    if program == "bash":
        script = REPO_ROOT / rest[0]
        if not script.exists():
            return problems + ["no script %s" % rest[0]]
        return problems + check_flags(script, rest[1:])
    if program.startswith("./"):
        script = REPO_ROOT / program
        if not script.exists():
            return problems + ["no script %s" % program]
        return problems + check_flags(script, rest)
    if program not in EXTERNAL:
        problems.append("unknown program %r (add it to EXTERNAL if it is not ours)" % program)
    return problems


def test_every_command_in_the_docs_names_what_exists():
    bad = []
    count = 0
    for page in user_pages():
        for line in commands_in(page.read_text(encoding="utf-8")):
            for command in simple_commands(line):
                count += 1
                bad += ["%s: `%s`: %s" % (page.relative_to(REPO_ROOT), command, p)
                        for p in check_command(words(command))]
    assert count > 40, count  # the extraction found the docs' commands
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("command, problem", [
    ("bash scripts/setup.sh --every", "has no option --every"),
    ("bash scripts/no_such.sh", "no script scripts/no_such.sh"),
    (".venv/bin/mpirun -np 2 .venv/bin/python examples/pytorch/gone.py", "no file"),
    ("perseusrun --check-everything", "perseusrun has no option --check-everything"),
    ("python -m perseus.no_such_module x", "no module perseus.no_such_module"),
    ("frobnicate --now", "unknown program 'frobnicate'"),
    ("mkdocs build --strict", "unknown program 'mkdocs'"),
    ("python benchmarks/allreduce_bench.py --repeats 3", "has no option --repeats"),
])
def test_the_command_check_finds_what_does_not_exist(command, problem):
    problems = [p for c in simple_commands(command) for p in check_command(words(c))]
    assert any(problem in p for p in problems), problems


# ---- the configuration table -----------------------------------------------------------
AGREEMENT_COLUMN = {"kAgreed": "same", "kRank0": "set", "kLocal": ""}


def core_table():
    """(name, Horovod spelling or None, agreement) for each row of config.cc's Table()."""
    source = (REPO_ROOT / "csrc" / "src" / "engine" / "config.cc").read_text()
    body = source.split("const std::vector<Variable>& Table() {", 1)[1].split("\n  };", 1)[0]
    rows = re.findall(r'\{"(PERSEUS_\w+)",\s*(nullptr|"(\w+)"),.*?\b(kAgreed|kRank0|kLocal)\b',
                      body, flags=re.S)
    return [(name, alias or None, agreement) for name, _, alias, agreement in rows]


def core_defaults():
    """The core's own defaults: config() before init(), in an environment without any
    PERSEUS_ or HOROVOD_ variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "HOROVOD_"))}
    code = "from perseus.common import basics; print(repr(basics.config()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return eval(out)  # noqa: S307 (our own repr of a dict of str)


def docs_table():
    """(name, alias, default, same) for each row of docs/configuration.md's table."""
    rows = []
    for line in (DOCS / "configuration.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `(PERSEUS_\w+)`(?: \(`(HOROVOD_\w+)`[^)]*\))? \|([^|]*)\|([^|]*)\|", line)
        if m:
            rows.append((m.group(1), m.group(2), m.group(3).strip(), m.group(4).strip()))
    return rows


def test_configuration_table_is_the_cores():
    core = core_table()
    docs = docs_table()
    assert len(core) >= 20, core  # the parse found the table
    assert [r[0] for r in docs] == [r[0] for r in core], "rows (in the core's order)"
    defaults = core_defaults()
    assert list(defaults) == [r[0] for r in core]
    for (name, alias, agreement), (_, doc_alias, doc_default, same) in zip(core, docs):
        assert doc_alias == alias, (name, doc_alias, alias)
        assert same == AGREEMENT_COLUMN[agreement], (name, same, agreement)
        value = defaults[name]
        if value == "":
            assert doc_default.startswith("empty"), (name, doc_default)
        else:
            assert doc_default == value, (name, doc_default, value)
