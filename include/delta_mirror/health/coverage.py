"""Which of the store's tables a DAG publishes: the table config's coverage of the store.

A table is *configured* when the effective table config (``--config``, else ``DELTA_MIRROR_CONFIG``,
else ``config/delta_mirror.yaml``, when that file exists) lists it under ``tables:``: the DAG
factory builds a DAG for exactly those names (``defaults`` only give them their settings, they add
no table). The two ways the config and the store disagree, each said in one line everywhere
(``status``, ``health``, the "Delta Mirror" page, ``mirror``, the publish tasks):

- a table in the store that the config does not list: **not configured: no DAG publishes it**
  (its unpublished versions are not a lag: nobody is meant to publish them);
- a table the config lists that the store has never had: **not in store**, and publishing it is a
  ``TableNotFoundError`` naming the config file and what to do.

Without a table config nothing is known about DAGs (a CLI-only setup): every table counts as
covered, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from delta_mirror.errors import TableNotFoundError
from delta_mirror.table_config import ConfigError, MirrorConfig, default_config_path, load_config

#: What ``status``, ``health`` and the page say instead of a lag for a table no DAG publishes.
NOT_CONFIGURED = "not configured: no DAG publishes it"
#: What they say of a configured table the store lacks.
NOT_IN_STORE = "not in store"


@dataclass(frozen=True)
class Coverage:
    """The table names a table config lists (``source``: its file), asked by name."""

    source: str
    names: frozenset[str]

    def configured(self, name: str) -> bool:
        return name in self.names

    def missing(self, present: Iterable[str]) -> list[str]:
        """The configured names absent from ``present`` (a store's table names), sorted."""
        return sorted(self.names - set(present))

    def not_configured_hint(self) -> str:
        """What to do about a table this config does not list."""
        return f"to mirror it, list it under `tables:` in {self.source}"


def coverage_of(config: MirrorConfig | None) -> Coverage | None:
    """The coverage of ``config``; None without one (nothing known: every table counts as covered)."""
    if config is None:
        return None
    return Coverage(config.source, frozenset(config.tables))


def effective_config(config_path: str | Path | None = None) -> MirrorConfig | None:
    """The table config a command runs with: ``config_path`` (which must exist), else
    ``DELTA_MIRROR_CONFIG`` or ``config/delta_mirror.yaml`` when that file exists, else None."""
    if config_path:
        return load_config(Path(config_path))
    path = default_config_path()
    return load_config(path) if path.is_file() else None


def not_in_store_error(name: str, config: MirrorConfig | None) -> TableNotFoundError:
    """The one line for a table the store lacks: when ``config`` lists it, which file does and what
    to do (commit its first version, import an existing log, or fix the name); else the store's
    own "no table named" line."""
    if config is None or name not in config.tables:
        return TableNotFoundError(
            f"no table named '{name}' in the store",
            table=name,
            hint="list tables with `delta-mirror status`, or create it with import/commit",
        )
    source = config.source
    conn = config.tables[name].store_conn_id
    elsewhere = f" (its entry reads the store of connection '{conn}': is this that store?)" if conn else ""
    return TableNotFoundError(
        f"{NOT_IN_STORE}: configured in {source}, but the store has no such table{elsewhere}",
        table=name,
        hint=f"commit its first version (`delta-mirror commit {name} --location <root> --actions -`, "
        f"or a Spark job through the commit service), adopt an existing Delta log with "
        f"`delta-mirror import <root> --table {name}`, or fix the name in {source}",
    )


def without_table(error: TableNotFoundError) -> str:
    """The error's line without its "table 'x': " prefix (for a row that names the table already)."""
    return f"{error.what} — {error.hint}" if error.hint else error.what


def not_in_store_here(name: str) -> TableNotFoundError:
    """``not_in_store_error`` with this process's table config (``DELTA_MIRROR_CONFIG`` or the
    default file; an unreadable config is left out: the error is about the store)."""
    try:
        config = effective_config()
    except ConfigError:
        config = None
    return not_in_store_error(name, config)


__all__ = [
    "NOT_CONFIGURED",
    "NOT_IN_STORE",
    "Coverage",
    "coverage_of",
    "effective_config",
    "not_in_store_error",
    "not_in_store_here",
    "without_table",
]
