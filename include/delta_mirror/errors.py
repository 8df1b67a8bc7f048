"""The error hierarchy: retryability is a property of the error type.

MirrorError                      (base; carries ``error_class``, ``table``, ``version``, ``hint``)
├── TransientError               retry with backoff (throttling, 5xx, timeouts, DB serialization)
│   └── LeaseHeldError           another publisher is working on the table right now
├── PermanentError               fail fast, fix configuration (auth, missing bucket, bad URL)
│   ├── UnsupportedTableError    the source uses a feature we refuse (e.g. catalogManaged)
│   ├── NotADeltaTableError      the source has no readable ``_delta_log``
│   ├── TableHaltedError         the table is halted: no commits until `delta-mirror resume`
│   └── TableNotFoundError / TableExistsError
├── ConflictError                halt, alert, never overwrite
│   ├── CommitConflictError      another writer committed that version first
│   │   └── StoreBehindError     the store is behind the published log (failover, restore)
│   └── PublishConflictError     a different file already sits at ``_delta_log/<v>.json``
└── DataError                    an invalid action or a version gap: nothing is written
    └── InvalidActionError
        └── CommitTooLargeError  over the commit size limits (actions or bytes)
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TypedDict, Unpack


class ErrorClass(StrEnum):
    TRANSIENT = "TRANSIENT"
    PERMANENT = "PERMANENT"
    CONFLICT = "CONFLICT"
    DATA = "DATA"


class ErrorContext(TypedDict, total=False):
    """The keywords every ``MirrorError`` takes besides its text: a subclass that adds fields
    accepts these as ``**context`` instead of repeating them."""

    table: str | None
    version: int | None
    hint: str | None


class MirrorError(Exception):
    """Base of every error the core raises on purpose."""

    error_class: ErrorClass = ErrorClass.PERMANENT
    retryable: bool = False

    def __init__(
        self,
        what: str,
        *,
        table: str | None = None,
        version: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.what = what
        self.table = table
        self.version = version
        self.hint = hint
        super().__init__(self.message)

    def __str__(self) -> str:
        # the message from the fields as they are now: a caller may refine what/hint after raise
        return self.message

    @property
    def message(self) -> str:
        where = []
        if self.table is not None:
            where.append(f"table '{self.table}'")
        if self.version is not None:
            where.append(f"version {self.version}")
        text = self.what
        if where:
            text = f"{', '.join(where)}: {text}"
        if self.hint:
            text = f"{text} — {self.hint}"
        return text


class TransientError(MirrorError):
    error_class = ErrorClass.TRANSIENT
    retryable = True


class LeaseHeldError(TransientError):
    """Another publisher holds the table's lease (it expires by itself if that publisher died)."""


class PermanentError(MirrorError):
    error_class = ErrorClass.PERMANENT


class UnsupportedTableError(PermanentError):
    """The table uses a protocol feature delta-mirror refuses to take authority over."""


class NotADeltaTableError(PermanentError):
    pass


class TableNotFoundError(PermanentError):
    pass


class TableHaltedError(PermanentError):
    """The table is halted (``dl_tables.state``): commits are refused until it is resumed."""


class TableExistsError(PermanentError):
    pass


class ConflictError(MirrorError):
    error_class = ErrorClass.CONFLICT


class CommitConflictError(ConflictError):
    """Optimistic concurrency: the version was taken by another writer."""


class PublishConflictError(ConflictError):
    """A different file already exists where the canonical commit belongs."""

    def __init__(
        self, what: str, *, expected_sha256: str = "", found_sha256: str = "", **context: Unpack[ErrorContext]
    ) -> None:
        self.expected_sha256 = expected_sha256
        self.found_sha256 = found_sha256
        super().__init__(what, **context)


class StoreBehindError(CommitConflictError):
    """The store's latest version is below the versions already published on storage (an
    asynchronous failover lost acknowledged commits, or the store was restored from a backup):
    no version is committed while its ``<v>.json`` exists with other bytes; ``delta-mirror
    recover`` adopts the published versions back (``jobs/recover.py``)."""

    def __init__(self, what: str, *, behind: int = 0, **context: Unpack[ErrorContext]) -> None:
        self.behind = behind
        super().__init__(what, **context)


class DataError(MirrorError):
    error_class = ErrorClass.DATA


class InvalidActionError(DataError):
    pass


class VersionGapError(DataError):
    """A commit beyond the store's next version. From a LogStore writer it means ``<next>.json`` is
    on storage already: a writer outside the authority, or a store that lost its tail (the commit
    service then answers ``StoreBehindError``, naming ``recover``)."""

    def __init__(self, what: str, *, next_version: int, **context: Unpack[ErrorContext]) -> None:
        self.next_version = next_version
        super().__init__(what, **context)


class CommitTooLargeError(InvalidActionError):
    """The commit exceeds ``DELTA_MIRROR_MAX_COMMIT_ACTIONS`` or ``DELTA_MIRROR_MAX_COMMIT_BYTES``."""


_TRACE = re.compile(r"\n\s*(?:0: |at [\w$.<>]+\(|JVM stacktrace:)")  # a Rust backtrace, a JVM stack


def first_line(exc: BaseException, limit: int = 300, *, joined: bool = False) -> str:
    """An error in one short line for a task log, a per-table result or a validation report: a
    ``MirrorError``'s message, else ``Type: text``. Its first line (a driver error may carry a long SQL
    statement on later lines); ``joined`` (a Delta reader's error: deltalake, DuckDB, Spark): every
    line before the Rust backtrace or JVM stack trace, whitespace collapsed, ``limit`` on the text."""
    if not joined:
        text = exc.message if isinstance(exc, MirrorError) else f"{type(exc).__name__}: {exc}"
        lines = text.strip().splitlines()
        return (lines[0] if lines else type(exc).__name__)[:limit]
    body = " ".join(_TRACE.split(str(exc), maxsplit=1)[0].split())[:limit]
    return f"{type(exc).__name__}: {body}"


__all__ = [
    "CommitConflictError",
    "CommitTooLargeError",
    "ConflictError",
    "DataError",
    "ErrorClass",
    "ErrorContext",
    "InvalidActionError",
    "LeaseHeldError",
    "MirrorError",
    "NotADeltaTableError",
    "PermanentError",
    "PublishConflictError",
    "StoreBehindError",
    "TableExistsError",
    "TableHaltedError",
    "TableNotFoundError",
    "TransientError",
    "UnsupportedTableError",
    "VersionGapError",
    "first_line",
]
