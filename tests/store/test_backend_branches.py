"""No branch on the database kind outside ``store/backends/`` and the migrations (issue 38 item 3):
what differs by database is asked of its ``Backend``, so a fix to one database's way cannot miss a
copy of the branch elsewhere.

A branch here is what the AST shows: a comparison with a database's name (``"sqlite"``,
``"postgresql"``, ``"mysql"``, ``"duckdb"``, ...) or with a dialect's or URL's name or driver, a
``startswith`` of a database name, or ``is_mariadb``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import delta_mirror.store

STORE = Path(delta_mirror.store.__file__).parent
_NAMES = {"sqlite", "postgresql", "postgres", "mysql", "mariadb", "duckdb", "pysqlite", "psycopg", "pymysql"}
#: Files still allowed their branches, with how many (the target is none: the list only shrinks).
#: db.py: the engine and error halves of each database (to move under backends/ with their
#: modules); mysql_store.py and duckdb_store.py: a database's own module outside backends/ (the
#: CLI and the Airflow hook import duckdb_store by that path).
LEFT = {
    "db.py": 11,
    "duckdb_store.py": 1,
    "mysql_store.py": 6,
}


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
    out = {}
    for path in sorted(STORE.rglob("*.py")):
        rel = path.relative_to(STORE).as_posix()
        if rel.startswith(("backends/", "migrations/")):
            continue
        lines = branches(path.read_text())
        if lines:
            out[rel] = lines
    return out


def test_the_store_branches_on_the_database_kind_only_in_its_backends() -> None:
    found = counts()
    over = {f: lines for f, lines in found.items() if len(lines) > LEFT.get(f, 0)}
    assert not over, f"branches on the database kind outside store/backends/ (ask the Backend): {over}"


def test_the_allowance_only_shrinks() -> None:
    """A file that lost its branches loses its allowance (so the list reaches empty)."""
    found = counts()
    stale = {f: n for f, n in LEFT.items() if len(found.get(f, [])) < n}
    assert not stale, f"lower these allowances in LEFT: {stale} (found {found})"


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
