"""The documentation's links and paths lead somewhere.

Every relative link in README.md, docs/*.md and actors/README.md resolves to a
file or folder of the checkout, and a link with an ``#anchor`` into a Markdown
file names one of its headings (GitHub's anchors). A repository path written
in backticks (``runtime/recall/hybrid.py``, ``tools/bench/footprint.py --json``)
exists. The README stays a quick start: at most 200 lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200

# A backticked token is taken for a path of this repository when it starts
# with one of its top-level folders (``ray/serve/...`` or ``/proc/...`` are not).
TOP_DIRS = ("runtime", "actors", "device", "configs", "tools", "tests", "docs", ".ci")

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)((?:(?!\n\s*\n).)+?)\1", re.S)  # may wrap, never past a paragraph
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
TOP = "|".join(re.escape(d) for d in TOP_DIRS)
PATH_TOKEN = re.compile(rf"^(?:\./)?((?:{TOP})/[\w./-]*)")


def documents(root: Path = ROOT) -> list[Path]:
    found = [root / "README.md", *sorted((root / "docs").glob("*.md")),
             root / "actors" / "README.md"]
    return [p for p in found if p.exists()]


def split_fences(text: str) -> tuple[list[str], list[str]]:
    """The lines outside fenced code blocks, and those inside."""
    prose: list[str] = []
    code: list[str] = []
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        (code if inside else prose).append(line)
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links reduced to their text, lower case,
    punctuation dropped (letters, digits, ``_``, ``-`` and spaces kept), spaces
    turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_fences(path.read_text())
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose:
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    prose, _ = split_fences(path.read_text())
    text = CODE_SPAN.sub("", "\n".join(prose))
    return [m.group(1) for m in LINK.finditer(text)]


def link_problem(doc: Path, target: str, root: Path = ROOT) -> str | None:
    """Why a link of ``doc`` leads nowhere, or None when it resolves."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
        return None  # http:, https:, mailto: — not ours to check offline
    file_part, _, anchor = target.partition("#")
    dest = (doc.parent / file_part).resolve() if file_part else doc
    try:
        dest.relative_to(root)
    except ValueError:
        return f"{target}: outside the repository"
    if not dest.exists():
        return f"{target}: no such file or folder"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: no heading with the anchor #{anchor} in {dest.relative_to(root)}"
    return None


def repo_paths(path: Path) -> list[str]:
    """Tokens in backticks (inline, or in fenced code) that look like paths of
    this repository."""
    prose, code = split_fences(path.read_text())
    tokens: list[str] = []
    for span in CODE_SPAN.finditer("\n".join(prose)):
        tokens.extend(span.group(2).split())
    for line in code:
        tokens.extend(line.split())
    found = []
    for token in tokens:
        hit = PATH_TOKEN.match(token.strip("'\"(),;:"))
        if hit is None or any(c in token for c in "*<>{}$…"):
            continue
        found.append(hit.group(1).split("::")[0].rstrip(".,:;"))
    return found


DOCS = documents()


def test_the_documents_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "actors/README.md", "docs/security.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(doc: Path) -> None:
    problems = [p for t in links(doc) if (p := link_problem(doc, t)) is not None]
    assert problems == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_backticked_repository_path_exists(doc: Path) -> None:
    missing = sorted({p for p in repo_paths(doc) if not (ROOT / p).exists()})
    assert missing == []


def test_the_readme_is_a_quick_start() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """Broken links, anchors and paths are caught (and good ones pass)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "real.py").write_text("")
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## The `reverie` command: run\n")
    doc = tmp_path / "docs" / "page.md"
    doc.write_text(
        "# Page\n\n"
        "[ok](other.md#the-reverie-command-run) [gone](missing.md) "
        "[bad anchor](other.md#nowhere) [self](#page) [web](https://example.org)\n\n"
        "`runtime/real.py` and `runtime/gone.py --flag`\n\n"
        "```sh\npython runtime/also_gone.py\n```\n")
    problems = [p for t in links(doc) if (p := link_problem(doc, t, tmp_path)) is not None]
    assert problems == ["missing.md: no such file or folder",
                        "other.md#nowhere: no heading with the anchor #nowhere in docs/other.md"]
    assert [p for p in repo_paths(doc) if not (tmp_path / p).exists()] == [
        "runtime/gone.py", "runtime/also_gone.py"]
