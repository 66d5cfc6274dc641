"""The docs as a user reads them: the pages, their shell blocks, and the commands in
them split into simple commands and words (tests/meta/test_docs.py checks each command;
tests/launch/test_launcher_mpi_match.py checks the launchers they name)."""
import re
import shlex

from support.jobs import REPO_ROOT

DOCS = REPO_ROOT / "docs"
README = REPO_ROOT / "README.md"


# Programs that start another command (the rest of the line), after their own options.
LAUNCHERS = {"mpirun", "perseusrun", "srun"}
PYTHONS = {"python", "python3"}


def user_pages():
    """README.md and the pages of the site (not docs/investigations/, kept out of it)."""
    return [README] + sorted(p for p in DOCS.rglob("*.md") if "investigations" not in p.parts)


def sh_blocks(text):
    return re.findall(r"^```(?:sh|bash)\n(.*?)^```", text, flags=re.S | re.M)


def commands_in(text):
    """(command line) for each line of every ```sh block and each inline `...` span
    that starts with a program a user runs; continuation lines joined, comments cut."""
    lines = []
    for block in sh_blocks(text):
        block = block.replace("\\\n", " ")
        lines += [re.split(r"\s#", l, 1)[0] for l in block.splitlines() if not l.startswith("#")]
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        first = re.sub(r"^([A-Z_]+=\S*\s+)+", "", span).split(" ")[0]
        if (first in PYTHONS | LAUNCHERS | {"bash", "./train.sh", "mkdocs"}
                or first.startswith(".venv")) \
                and " " in span:
            lines.append(span)
    return [l.strip() for l in lines if l.strip()]


def simple_commands(line):
    """The simple commands of a shell line: split at &&, ||, |, ; and $( )."""
    line = line.replace("$(", " ; ").replace(")", " ")
    return [c.strip() for c in re.split(r"&&|\|\||\||;", line) if c.strip()]


def words(command):
    try:
        tokens = shlex.split(command)
    except ValueError:
        tokens = command.split()
    tokens = [t.strip("[]") for t in tokens]  # [--only NAME]: an optional flag
    while tokens and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):
        tokens.pop(0)  # VAR=value before the program
    return [t for t in tokens if t]
