"""No branch on the database kind in the package outside ``store/backends/`` and the migrations
(issue 38 item 3): what differs by database is asked of its ``Backend``, so a fix to one database's
way cannot miss a copy of the branch elsewhere.

A branch here is what the AST shows: a comparison with a database's name (``"sqlite"``,
``"postgresql"``, ``"postgres"``, ``"mysql"``, ``"duckdb"``, ...) or with a dialect's or URL's name
or driver, a ``startswith`` of a database name, or ``is_mariadb``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import delta_mirror

PACKAGE = Path(delta_mirror.__file__).parent
#: Where each database's way lives (``store/backends/``), and the migrations, which are written once
#: for every database.
_HOMES = ("store/backends/", "store/migrations/")
_NAMES = {"sqlite", "postgresql", "postgres", "mysql", "mariadb", "duckdb", "pysqlite", "psycopg", "pymysql"}


def _is_kind(node: ast.AST) -> bool:
    if isinstance(node, ast.Call):
        return _is_kind(node.func)
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr in ("is_mariadb", "get_backend_name", "get_dialect"):
        return True
    return (
        node.attr in ("name", "drivername", "driver")
        and isinstance(node.value, ast.Attribute)
        and node.value.attr in ("dialect", "url")
    )


def _is_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split("+")[0] in _NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_name(e) for e in node.elts)
    return False


def _branches_here(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        return any(_is_kind(o) or _is_name(o) for o in (node.left, *node.comparators))
    if not isinstance(node, ast.Call) or not node.args:
        return False
    if isinstance(node.func, ast.Name) and node.func.id == "getattr":
        return (
            len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "is_mariadb"
        )
    return isinstance(node.func, ast.Attribute) and node.func.attr == "startswith" and _is_name(node.args[0])


def branches(source: str) -> list[int]:
    """The lines of ``source`` that branch on the database kind."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.expr | ast.stmt) and _branches_here(node)
    )


def counts() -> dict[str, list[int]]:
    """The files of the package outside the backends' homes with branches, and their lines."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(_HOMES):
            continue
        lines = branches(path.read_text(encoding="utf-8"))
        if lines:
            out[rel] = lines
    return out


def test_the_package_branches_on_the_database_kind_only_in_the_store_backends() -> None:
    found = counts()
    assert not found, f"branches on the database kind outside store/backends/ (ask the Backend): {found}"


def test_the_count_covers_the_whole_package_but_the_backends_and_migrations() -> None:
    seen = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    assert {
        "store/db.py",
        "airflow/hooks.py",
        "spark/checkpoint_engine.py",
        "dev/cluster/__init__.py",
    } <= seen
    assert branches((PACKAGE / "store/backends/mysql.py").read_text(encoding="utf-8"))  # would be found


def test_the_counter_sees_each_form_of_branch() -> None:
    src = """
if engine.dialect.name == "postgresql": pass
x = "DIV" if conn.dialect.name in ("mysql",) else "/"
if url.drivername.startswith("postgresql"): pass
if getattr(dialect, "is_mariadb", False): pass
if parsed.get_backend_name() == "sqlite": pass
if backend.copies: pass
"""
    assert branches(src) == [2, 3, 4, 5, 6]
