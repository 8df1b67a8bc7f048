"""The docs site's pages as the tests read them: marked command blocks, headings, links (issue 37).

A fenced block preceded by ``<!-- docs-test: NAME -->`` (an HTML comment: the site does not show
it) is one that ``test_docs_examples.py`` runs; a page's blocks of one name run in page order, as
one script.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
MARKER = re.compile(r"^<!-- docs-test: (?P<name>[\w-]+) -->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)(?P<info>.*)$")
HEADING = re.compile(r"^(?P<level>#{1,6}) (?P<text>.+?)\s*#*\s*$")
#: the README before it was cut to a short page (issue 37): everything it said is on a docs page
OLD_README_COMMIT = "538c043"


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its info string (``bash``, ``python title="job.py"``) and text."""

    page: str
    line: int
    info: str
    text: str
    marker: str | None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with the docs-test marker that precedes it (if any)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    marker: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            marker = m.group("name")
            i += 1
            continue
        f = FENCE.match(line)
        if f:
            close = f.group("fence")
            body: list[str] = []
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(close):
                body.append(lines[j])
                j += 1
            found.append(Block(path.name, i + 1, f.group("info").strip(), "\n".join(body) + "\n", marker))
            marker = None
            i = j + 1
            continue
        if line.strip():
            marker = None  # a marker belongs to the block right after it (blank lines allowed)
        i += 1
    return found


def marked(path: Path, name: str) -> list[Block]:
    """The blocks of ``path`` marked ``<!-- docs-test: name -->``, in page order."""
    return [b for b in blocks(path) if b.marker == name]


def headings(text: str) -> list[str]:
    """The Markdown headings of ``text`` (outside fenced blocks), without their ``#``s."""
    out: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        f = FENCE.match(line)
        if f:
            if fence is None:
                fence = f.group("fence")
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            h = HEADING.match(line)
            if h:
                out.append(h.group("text"))
    return out


def slug(heading: str) -> str:
    """The anchor Python-Markdown's ``toc`` (mkdocs) gives a heading; GitHub's is the same for ours."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def old_readme() -> str | None:
    """README.md as it was at ``OLD_README_COMMIT``; None when git or that commit is not here."""
    try:
        proc = subprocess.run(
            ["git", "show", f"{OLD_README_COMMIT}:README.md"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except OSError:
        return None
    return str(proc.stdout) if proc.returncode == 0 else None


__all__ = ["DOCS", "REPO", "Block", "blocks", "headings", "marked", "old_readme", "pages", "slug"]
