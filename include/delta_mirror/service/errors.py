"""The commit service's errors and the status each answers with (docs/commit-service.md, "Routes").

The status of an error is decided by its type, never by its message: ``ERROR_STATUS`` is read in
order, the first type that matches wins (subclasses before their bases). Every error body is one
line of JSON, ``{"error": ..., "code": ...}``.
"""

from __future__ import annotations

import json
import logging

from delta_mirror.errors import (
    CommitConflictError,
    CommitTooLargeError,
    DataError,
    MirrorError,
    PermanentError,
    StoreBehindError,
    TableHaltedError,
    TableNotFoundError,
    TransientError,
)

#: Seconds a ``503`` asks the writer to wait (``Retry-After``).
RETRY_AFTER_SECONDS = 1


class UnauthorizedError(PermanentError):
    """The request has no token, or a wrong one."""


class RootNotAllowedError(PermanentError):
    """Version 0 of an unknown table whose root lies outside every ``--allow-root`` prefix."""


class NotCommittedError(PermanentError):
    """The table has no commit file for that version."""


class BadRequestError(PermanentError):
    """The request itself is malformed (no ``root``, a root that is no table URI, a bad version)."""


ERROR_STATUS: tuple[tuple[type[MirrorError], int, str], ...] = (
    (UnauthorizedError, 401, "unauthorized"),
    (RootNotAllowedError, 403, "root_not_allowed"),
    (NotCommittedError, 404, "not_committed"),
    (TableNotFoundError, 404, "unknown_table"),
    (StoreBehindError, 422, "store_behind"),
    (CommitConflictError, 409, "version_taken"),
    (CommitTooLargeError, 413, "too_large"),
    (TableHaltedError, 423, "halted"),
    (DataError, 422, "invalid"),
    (BadRequestError, 400, "bad_request"),
    (TransientError, 503, "unavailable"),
    (MirrorError, 500, "internal"),
)

log = logging.getLogger("delta_mirror.service")

#: The answer when the store cannot be used: nothing of the store (URL, user, host, port, database,
#: file path) is in it; the service's log has the cause, with the password masked.
UNAVAILABLE_BODY = (
    b'{"error":"store unavailable: the commit service cannot reach its store right now'
    b' (its log names the cause); retry later","code":"unavailable"}'
)

#: The answer to anything unexpected (a bug, a misconfigured store); the log has the details.
INTERNAL_BODY = b'{"error":"unexpected error in the commit service (see its log)","code":"internal"}'


def json_body(content: object) -> bytes:
    """``content`` as one line of JSON, rendered as Starlette's ``JSONResponse`` renders it."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def error_answer(exc: MirrorError) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """The status, the one-line JSON body and the extra headers (``Retry-After`` on 503) for ``exc``."""
    status, code = next((s, c) for kind, s, c in ERROR_STATUS if isinstance(exc, kind))
    if status == 503:
        log.warning("store unavailable: %s", exc.message)
        return status, UNAVAILABLE_BODY, [(b"retry-after", str(RETRY_AFTER_SECONDS).encode())]
    if status == 500:
        log.error("unexpected error: %s", exc.message)
        return status, INTERNAL_BODY, []
    return status, json_body({"error": " ".join(exc.message.split()), "code": code}), []


__all__ = [
    "ERROR_STATUS",
    "INTERNAL_BODY",
    "RETRY_AFTER_SECONDS",
    "UNAVAILABLE_BODY",
    "BadRequestError",
    "NotCommittedError",
    "RootNotAllowedError",
    "UnauthorizedError",
    "error_answer",
    "json_body",
]
