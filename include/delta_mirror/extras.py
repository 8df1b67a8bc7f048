"""The optional parts of the package and the one check that names the extra a part needs.

The base install is the SQLite/PostgreSQL store, the CLI and the publisher. The rest comes with an
extra (``pyproject.toml``): ``mysql``, ``duckdb``, ``service`` (the commit service's server),
``spark`` and ``airflow``. Code that uses such a part calls ``require`` before its first import of
the library, so a missing extra is one line naming it (the CLI prints ``error: ...`` and exits 1),
never a ``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import importlib.util

from delta_mirror.errors import PermanentError

DISTRIBUTION = "delta-mirror"


class MissingExtraError(PermanentError):
    """A part of the package was used whose extra is not installed."""

    def __init__(self, what: str, extra: str, module: str) -> None:
        self.extra = extra
        self.module = module
        super().__init__(
            f"{what} needs the {extra} extra ({module} is not installed)",
            hint=f"pip install '{DISTRIBUTION}[{extra}]'",
        )


def installed(module: str) -> bool:
    """Whether ``module`` (a top-level name) can be imported, without importing it.

    ``None`` in ``sys.modules`` (an import that was blocked) and a finder that refuses the name
    count as absent, as the import itself would fail.
    """
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, extra: str, what: str) -> None:
    """Raise ``MissingExtraError`` unless ``module`` is installed: ``what`` (e.g. "the MySQL/MariaDB
    store") needs the ``extra`` that brings it. The caller imports the module itself, when it needs it.
    """
    if not installed(module):
        raise MissingExtraError(what, extra, module)


__all__ = ["DISTRIBUTION", "MissingExtraError", "installed", "require"]
