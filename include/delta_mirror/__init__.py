"""delta-mirror: a SQL database is the authority for Delta logs; the mirror publishes them.

The package is tiered (``docs/architecture.md``): ``delta`` (the protocol model, no SQL),
``store`` (the SQL authority), ``jobs`` (publish, import, reconcile, maintain, validate),
``health`` (status, monitoring, breakers), then the shells: ``cli``, ``service`` (the commit service),
``spark`` and ``airflow``. The core library (everything but ``delta_mirror.airflow``) never
imports Airflow.

The public API is re-exported here and loaded on first use, so ``import delta_mirror`` stays
cheap and pulls in neither SQLAlchemy nor PyArrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from delta_mirror.lazy import lazy_names
from delta_mirror.version import ENGINE_INFO, __version__

# public name -> the module that defines it
_PUBLIC = {
    "SqlStore": "delta_mirror.store.sql_store",
    "CommitResult": "delta_mirror.store.sql_store",
    "Snapshot": "delta_mirror.store.sql_store",
    "Publisher": "delta_mirror.jobs.publisher",
    "PublishResult": "delta_mirror.jobs.publisher",
    "RetryPolicy": "delta_mirror.jobs.publisher",
    "import_table": "delta_mirror.jobs.importer",
    "ImportResult": "delta_mirror.jobs.importer",
    "reconcile": "delta_mirror.jobs.reconcile",
    "ReconcileReport": "delta_mirror.jobs.reconcile",
    "cleanup_log": "delta_mirror.jobs.maintenance",
    "validate_table": "delta_mirror.jobs.validate",
    "ValidationReport": "delta_mirror.jobs.validate",
    "table_status": "delta_mirror.health.status",
    "TableStatus": "delta_mirror.health.status",
    "health_report": "delta_mirror.health.monitoring",
    "open_store": "delta_mirror.storage",
    "load_config": "delta_mirror.table_config",
    "MirrorError": "delta_mirror.errors",
    "TransientError": "delta_mirror.errors",
    "PermanentError": "delta_mirror.errors",
    "DataError": "delta_mirror.errors",
    "ConflictError": "delta_mirror.errors",
}

if TYPE_CHECKING:
    from delta_mirror.errors import ConflictError, DataError, MirrorError, PermanentError, TransientError
    from delta_mirror.health.monitoring import health_report
    from delta_mirror.health.status import TableStatus, table_status
    from delta_mirror.jobs.importer import ImportResult, import_table
    from delta_mirror.jobs.maintenance import cleanup_log
    from delta_mirror.jobs.publisher import Publisher, PublishResult, RetryPolicy
    from delta_mirror.jobs.reconcile import ReconcileReport, reconcile
    from delta_mirror.jobs.validate import ValidationReport, validate_table
    from delta_mirror.storage import open_store
    from delta_mirror.store.sql_store import CommitResult, Snapshot, SqlStore
    from delta_mirror.table_config import load_config


__getattr__ = lazy_names(__name__, _PUBLIC)


__all__ = [
    "ENGINE_INFO",
    "CommitResult",
    "ConflictError",
    "DataError",
    "ImportResult",
    "MirrorError",
    "PermanentError",
    "PublishResult",
    "Publisher",
    "ReconcileReport",
    "RetryPolicy",
    "Snapshot",
    "SqlStore",
    "TableStatus",
    "TransientError",
    "ValidationReport",
    "__version__",
    "cleanup_log",
    "health_report",
    "import_table",
    "load_config",
    "open_store",
    "reconcile",
    "table_status",
    "validate_table",
]
