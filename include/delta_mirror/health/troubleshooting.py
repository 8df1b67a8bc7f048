"""Troubleshooting text per error class (shown in task failures, emails and docs)."""

from __future__ import annotations

from delta_mirror.errors import ErrorClass

TROUBLESHOOTING: dict[ErrorClass, str] = {
    ErrorClass.TRANSIENT: (
        "Transient: throttling, a 5xx answer, a timeout, a reset connection or a database "
        "serialization failure. It is retried with exponential backoff; if it persists, check the "
        "storage endpoint and the database, then let the reconcile DAG re-drive the table."
    ),
    ErrorClass.PERMANENT: (
        "Permanent: the configuration is wrong (credentials, a missing bucket, an unreachable or "
        "invalid location, an unknown table). Retrying will not help: fix what the message names, "
        "then re-run the task."
    ),
    ErrorClass.CONFLICT: (
        "Conflict: a different file already sits where the commit belongs (an external writer or a "
        "split brain), or another writer took the version. Nothing was overwritten and the table is "
        "halted. Compare both hashes, import the foreign commit or restore the log, then run "
        "`delta-mirror resume <table>`. 'Store behind published log by K versions (failover or "
        "restore?)' is not halted: the store lost versions readers may have seen (an asynchronous "
        "failover, a restore from backup) and refuses commits until `delta-mirror recover <table>` "
        "adopts the published versions back (docs/recovery.md)."
    ),
    ErrorClass.DATA: (
        "Data: an invalid action or a version gap in the store. Nothing partial was published and the "
        "table is halted at that version. Fix or remove the offending commit in the store, then run "
        "`delta-mirror resume <table>`."
    ),
}


def troubleshooting(error_class: ErrorClass) -> str:
    return TROUBLESHOOTING[error_class]


__all__ = ["TROUBLESHOOTING", "troubleshooting"]
