"""MkDocs hook (mkdocs.yml): benchmarks/README.md, kept beside the benchmarks, is
also the site's page benchmarks.md; the pages cited it, but it was not in the site.

Its links are written from benchmarks/: those into docs/ are made relative to the
site, and those into docs/investigations/ (kept out of the site) become the file's
path as text. A page's link to the file (../benchmarks/README.md, which works on
GitHub) leads to the site's page."""
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "benchmarks/README.md"
PAGE = "benchmarks.md"
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s#]*)(#[^)\s]*)?\)")


def on_files(files, config):
    text = (ROOT / SOURCE).read_text(encoding="utf-8")
    files.append(File.generated(config, PAGE, content=LINK.sub(_from_benchmarks, text)))
    return files


def _from_benchmarks(m):
    label, target, anchor = m.group(1), m.group(2), m.group(3) or ""
    if target.startswith("../docs/investigations/"):
        return "%s (`%s`)" % (label, target[len("../"):])
    if target.startswith("../docs/"):
        return "[%s](%s%s)" % (label, target[len("../docs/"):], anchor)
    return m.group(0)


def on_page_markdown(markdown, page, **kwargs):
    folder = posixpath.dirname(page.file.src_uri)

    def to_page(m):
        label, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        if target and posixpath.normpath(posixpath.join("docs", folder, target)) == SOURCE:
            return "[%s](%s%s)" % (label, posixpath.relpath(PAGE, folder or "."), anchor)
        return m.group(0)

    return LINK.sub(to_page, markdown)
