"""The package's shape: no import cycles between the modules of ``delta_mirror``.

Imports are read from the source (``ast``), function-level ones included: a lazy import that
closes a cycle still ties two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

from support.source_ast import parse_source

PACKAGE = Path(__file__).resolve().parents[1] / "include" / "delta_mirror"


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(parse_source(path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            found.update(subs if len(subs) == len(node.names) else [base, *subs])
    return {m for m in found if m in modules and m != name}


def import_cycles() -> list[list[str]]:
    """Strongly connected groups of modules (Tarjan), each sorted."""
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_package_has_no_import_cycles() -> None:
    assert import_cycles() == []


# The tiers (docs/architecture.md), lowest first. A module may import its own tier or a lower one.
# A folder is one tier, with one exception named here: spark/session.py and spark/s3a.py only build
# a SparkSession and its s3a settings (as storage/ opens object stores), so they are in the bottom
# tier, which jobs/ (the Spark reader) may import, while the rest of spark/ (ingest, pipeline, the
# checkpoint engine) runs jobs. A module's tier is that of its longest listed prefix.
TIERS: tuple[tuple[str, ...], ...] = (
    (
        "delta",
        "storage",
        "errors",
        "config",
        "version",
        "lazy",
        "failpoints",
        "extras",
        "spark.session",
        "spark.s3a",
    ),
    ("store", "table_config"),
    ("health",),
    ("jobs",),
    ("spark",),
    ("cli", "service", "airflow", "dev"),
)


def _tier(module: str) -> int | None:
    """The tier of ``delta_mirror.<name>...`` (longest matching prefix); None for the package itself."""
    rest = module.removeprefix("delta_mirror.")
    if rest == module:
        return None
    best: tuple[int, int] | None = None
    for rank, names in enumerate(TIERS):
        for name in names:
            matches = rest == name or rest.startswith(name + ".")
            if matches and (best is None or len(name) > best[0]):
                best = (len(name), rank)
    assert best is not None, f"{module} is in no tier: add it to TIERS (docs/architecture.md)"
    return best[1]


def upward_imports() -> list[str]:
    modules = _modules()
    found = []
    for name, path in sorted(modules.items()):
        here = _tier(name)
        for dep in sorted(_imports(name, path, modules)):
            there = _tier(dep)
            if here is not None and there is not None and there > here:
                found.append(f"{name} -> {dep}")
    return found


def test_each_module_imports_only_its_own_tier_or_lower_ones() -> None:
    assert upward_imports() == []


def test_a_module_belongs_to_the_tier_of_its_longest_named_prefix() -> None:
    assert _tier("delta_mirror.delta.actions") == 0
    assert _tier("delta_mirror.spark.session") == 0  # builds a session: the bottom, though in spark/
    assert _tier("delta_mirror.spark.s3a") == 0
    assert _tier("delta_mirror.spark.ingest") == 4
    assert _tier("delta_mirror.jobs.validate.spark_reader") == 3
    assert _tier("delta_mirror.airflow.operators.base") == 5


def _external_imports(path: Path) -> set[str]:
    """Every name a module imports from outside the package, dotted (``sqlalchemy.engine.make_url``;
    ``import x`` gives ``x``), function-level and ``TYPE_CHECKING`` imports included."""
    found: set[str] = set()
    for node in ast.walk(parse_source(path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


# URL parsing is no SQL: the store URL is redacted for messages (config.py) and built from an Airflow
# connection (the hook) with SQLAlchemy's own URL type, so that every dialect's syntax is read alike.
SQLALCHEMY_OUTSIDE_THE_STORE = {
    "delta_mirror.config": {"sqlalchemy.engine.make_url"},
    "delta_mirror.airflow.hooks": {"sqlalchemy.engine.URL", "sqlalchemy.engine.make_url"},
}


def sqlalchemy_outside_the_store() -> list[str]:
    """``module: name`` for each SQLAlchemy import outside ``store/`` not in the list above."""
    found = []
    for name, path in sorted(_modules().items()):
        if name == "delta_mirror.store" or name.startswith("delta_mirror.store."):
            continue
        allowed = SQLALCHEMY_OUTSIDE_THE_STORE.get(name, set())
        for imported in sorted(_external_imports(path)):
            if imported.split(".")[0] == "sqlalchemy" and imported not in allowed:
                found.append(f"{name}: {imported}")
    return found


def test_sql_lives_in_the_store_only_url_parsing_is_allowed_outside_by_name() -> None:
    assert sqlalchemy_outside_the_store() == []


def test_the_url_parsing_exceptions_are_still_used_so_none_outlives_its_reason() -> None:
    modules = _modules()
    for name, allowed in SQLALCHEMY_OUTSIDE_THE_STORE.items():
        assert allowed <= _external_imports(modules[name]), name


def test_the_delta_model_never_imports_the_storage_adapter() -> None:
    """``delta/`` owns the ``ObjectStore`` port (``delta/object_store.py``); ``storage/`` implements
    it, so the dependency points from the adapter to the model."""
    modules = _modules()
    wrong = [
        f"{name} -> {dep}"
        for name, path in sorted(modules.items())
        if name == "delta_mirror.delta" or name.startswith("delta_mirror.delta.")
        for dep in sorted(_imports(name, path, modules))
        if dep == "delta_mirror.storage"
    ]
    assert wrong == []


def test_the_store_owns_its_transactions_no_public_method_takes_a_connection() -> None:
    """A caller outside ``store/`` never holds a transaction of the store: a write of several steps
    is one store method or context manager (``SqlStore.importing``), not ``begin()`` plus ``conn=``."""
    import inspect

    from delta_mirror.store import SqlStore

    taking = [
        f"{name}({param})"
        for name, member in inspect.getmembers(SqlStore, inspect.isfunction)
        if not name.startswith("_")
        for param in inspect.signature(member).parameters
        if param in ("conn", "connection")
    ]
    assert taking == []
    assert not hasattr(SqlStore, "begin")
