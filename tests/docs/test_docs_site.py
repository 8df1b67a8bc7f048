"""``make docs``: the site builds with ``mkdocs build --strict``, and strict means what it says — a
link to a heading no page has, or to a page that does not exist, fails the build (issue 37, item 6).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from docs_kit import DOCS, REPO
from support.services import skip_or_fail
from support.waiting import load_scaled


def _mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    try:
        import material  # noqa: F401  (the theme)
        import mkdocs  # noqa: F401
    except ImportError as exc:
        skip_or_fail(f"the docs extra is not installed ({exc}): pip install -e '.[docs]'")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)},
        capture_output=True,
        text=True,
        timeout=load_scaled(300),
        check=False,
    )


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    return []


def _copy_site_sources(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copytree(DOCS, root / "docs")
    return root


def test_make_docs_builds_every_page_strictly(tmp_path: Path) -> None:
    proc = _mkdocs_build(REPO, tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["strict"] is True and config["theme"]["name"] == "material"
    in_nav = _nav_pages(config["nav"])
    assert sorted(in_nav) == sorted(p.name for p in DOCS.glob("*.md")), "every page is in the nav, once"
    for page in in_nav:
        assert (tmp_path / "site" / page.replace(".md", ".html")).is_file(), page


def test_a_broken_link_or_anchor_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path) -> None:
    """One build of the site with five faults planted; strict mode reports each and fails."""
    root = _copy_site_sources(tmp_path)
    with (root / "docs" / "index.md").open("a", encoding="utf-8") as f:
        f.write(
            "\nSee [the CLI's nothing](cli.md#no-such-heading), [a page](no-such-page.md), [up](../README.md).\n"
        )
    with (root / "docs" / "cli.md").open("a", encoding="utf-8") as f:
        f.write("\nAbove: [nothing](#no-such-heading).\n")
    (root / "docs" / "orphan.md").write_text("# A page nobody put in the nav\n", encoding="utf-8")
    proc = _mkdocs_build(root, tmp_path / "site")
    assert proc.returncode != 0
    expected = [
        "'cli.md' does not contain an anchor '#no-such-heading'",
        "contains a link 'no-such-page.md'",
        "contains a link '../README.md'",
        "Doc file 'cli.md' contains a link '#no-such-heading', but there is no such anchor on this page",
        "orphan.md",
    ]
    missing = [e for e in expected if e not in proc.stderr]
    assert not missing, f"{missing} not in:\n{proc.stderr[-3000:]}"
    assert proc.stderr.count("WARNING") == 5, proc.stderr[-3000:]
