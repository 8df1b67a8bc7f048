"""README.md is a short page and what it said before is on the docs pages (issue 37, "Done when":
README ≤ 300 lines; every claim it made before is on a docs page).

The README of ``OLD_README_COMMIT`` (1,755 lines) was split into docs/*.md by topic, its text
moved verbatim; only link targets changed (a README anchor became ``page.md#anchor``, a link to a
repository file outside docs/ became the path in backticks). So every heading of it is a heading
of some page, and every line of it, link targets and backticks aside, is on some page.
"""

from __future__ import annotations

import re

import pytest
from docs_kit import REPO, blocks, headings, marked, old_readme, pages, slug

README = REPO / "README.md"
README_MAX_LINES = 300


def _normalized(line: str) -> str:
    """A line without its link targets, brackets, backticks, heading marks and surrounding blanks."""
    line = re.sub(r"\]\([^)]*\)", "", line)
    line = line.replace("[", "").replace("]", "").replace("`", "")
    return re.sub(r"^#{1,6} ", "", line.strip()).strip()


# Old lines revised on purpose since the move, each with why: the fact it stated changed, and the
# page says the new one. Every entry must start some line of the old README (checked below).
REVISED = {
    "| delta-mirror status NAME --json --limit N |": "cli.md: status gained --config and "
    "the not-configured / not-in-store output (issue 37 item 8)",
    "| delta-mirror serve --host H --port 8787 ": "cli.md: serve gained --metrics-bind (issue 37 item 5)",
    "pip install -e '.airflow' (Airflow 3.3 with the smtp, postgres and amazon providers).": "airflow.md: "
    "the airflow extra brings the SMTP provider only since the lean extras (issue 37 item 3)",
    "holds one thin file; everything is built by delta_mirror.airflow.dag_factory": "airflow.md: the "
    "same sentence, reflowed around the extras' change",
    # issue 38 item 5: modules placed by tier; the pages name the new paths
    "cli/  commit_service.py  spark/": "how-it-works.md: the commit service is the service/ package",
    "- **Object storage** (storage.py)": "how-it-works.md: storage.py is the storage/ package",
    "delta_mirror.airflow.spark_operators)": "airflow.md: the Spark checkpoint operator is "
    "delta_mirror.airflow.operators.spark_submit",
    "from delta_mirror.spark_session import": "spark.md: spark_session.py is spark/session.py",
    "(EXTRA_EXCLUDES in spark_session.py)": "spark.md: spark_session.py is spark/session.py",
    "From Python: get_spark(authority=AuthorityConfig(url, roots))": "writing-from-spark.md: "
    "spark_session.py is spark/session.py",
    "costs 0.050 ms instead of 0.073); SQLite": "benchmarks.md: commit_http.py, which these figures "
    "name, was retired (issue 38 item 1); the figures are unchanged",
    "3 conflict (a racing writer, or a different file already published), 4 invalid data (the": "cli.md: "
    "exit 3 also covers a store behind its published log (issue 40 item 2)",
}


def _revised(line: str) -> bool:
    return any(line.startswith(prefix) for prefix in REVISED)


@pytest.fixture(scope="module")
def old() -> str:
    text = old_readme()
    if text is None:
        pytest.skip("git or the README's old commit is not in this checkout (a shallow clone?)")
    return str(text)


def test_the_readme_is_at_most_300_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_every_heading_of_the_old_readme_is_a_heading_of_a_docs_page(old: str) -> None:
    on_pages = {h for p in pages() for h in headings(p.read_text(encoding="utf-8"))}
    old_headings = headings(old)
    assert len(old_headings) == 41  # as the old README had them; a parsing slip would show here
    missing = [h for h in old_headings if h not in on_pages and h != "delta-mirror"]
    assert not missing, f"headings of the old README on no docs page: {missing}"


def test_every_line_of_the_old_readme_is_on_a_docs_page(old: str) -> None:
    corpus = "\n".join(
        _normalized(line) for p in pages() for line in p.read_text(encoding="utf-8").split("\n")
    )
    lines = [_normalized(line) for line in old.split("\n")]
    missing = [line for line in lines if line and line not in corpus and not _revised(line)]
    assert not missing, f"{len(missing)} lines of the old README are on no docs page, e.g. {missing[:5]}"
    stale = [prefix for prefix in REVISED if not any(line.startswith(prefix) for line in lines)]
    assert not stale, f"REVISED names lines the old README never had: {stale}"


def test_the_readmes_links_lead_to_files_and_headings_that_exist() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links, "the README links into the docs"
    broken: list[str] = []
    for link in links:
        if re.match(r"^[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = REPO / path if path else README
        if not target.exists():
            broken.append(f"{link}: no file {path}")
        elif anchor and anchor not in {slug(h) for h in headings(target.read_text(encoding="utf-8"))}:
            broken.append(f"{link}: no heading #{anchor} in {path}")
    assert not broken, broken


def _commands(text: str) -> list[str]:
    """The shell lines of ``text`` without comments, whitespace collapsed."""
    return [
        " ".join(line.split("#", 1)[0].split()) for line in text.splitlines() if line.split("#", 1)[0].strip()
    ]


def test_the_readmes_first_table_commands_are_the_ones_the_getting_started_page_runs() -> None:
    readme_blocks = [b for b in blocks(README) if "delta-mirror init" in b.text]
    assert len(readme_blocks) == 1, "the README shows one 'first table' block"
    ran = set(_commands("".join(b.text for b in marked(REPO / "docs" / "getting-started.md", "local"))))
    not_run = [c for c in _commands(readme_blocks[0].text) if c not in ran]
    assert not not_run, f"README commands the getting-started test does not run: {not_run}"
