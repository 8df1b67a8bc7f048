"""Table-level failures (``dl_table_failures``, migration 0006): a publish attempt that failed.

A version's failed put is recorded on its status row (``mirror_status.py``); this records the
attempt as a whole, whatever failed — opening or listing the location, credentials, the store, a
version's put — so that ``status``, ``health``, the UI and the reconcile e-mail see a table that
cannot publish at its first failed attempt, not only once its lag breaches the SLO. One row per
table, the latest error and how long and how many attempts in a row it has failed; the next
successful attempt deletes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from delta_mirror.delta.protocol import now_ms
from delta_mirror.store import db
from delta_mirror.store.base import CHUNK, StoreBase
from delta_mirror.store.schema import dl_table_failures

MESSAGE_LIMIT = 1000  # the first line of the error, at most this many characters


@dataclass(frozen=True)
class TableFailure:
    error_class: str
    message: str
    first_failed_at: int  # epoch ms of the first failed attempt in a row
    last_failed_at: int
    attempts: int  # failed attempts in a row

    def to_json(self) -> dict[str, Any]:
        return {
            "error_class": self.error_class,
            "error": self.message,
            "first_failed_at": self.first_failed_at,
            "last_failed_at": self.last_failed_at,
            "attempts": self.attempts,
        }


def one_line(message: str) -> str:
    lines = message.strip().splitlines()
    return (lines[0] if lines else "")[:MESSAGE_LIMIT]


class TableFailures(StoreBase):
    """Record, clear and read the tables' failed publish attempts."""

    def record_table_failure(
        self, table_id: int, error_class: str, message: str, at: int | None = None
    ) -> None:
        """One more failed attempt: the first creates the row, the next ones count and keep the
        latest error (a race of two recorders: the loser of the insert counts on the winner's row)."""
        at = now_ms() if at is None else int(at)
        values = {"error_class": str(error_class)[:16], "message": one_line(message) or "(no message)"}
        more = (
            update(dl_table_failures)
            .where(dl_table_failures.c.table_id == table_id)
            .values(**values, last_failed_at=at, attempts=dl_table_failures.c.attempts + 1)
        )
        with db.translated(self.url, "recording a table failure"):
            for _ in range(2):
                try:
                    with self.engine.begin() as conn:
                        if int(conn.execute(more).rowcount or 0) == 0:
                            conn.execute(
                                insert(dl_table_failures).values(
                                    table_id=table_id,
                                    **values,
                                    first_failed_at=at,
                                    last_failed_at=at,
                                    attempts=1,
                                )
                            )
                    return
                except IntegrityError:
                    continue

    def clear_table_failure(self, table_id: int) -> None:
        """A successful attempt: the table publishes again."""
        with db.translated(self.url, "clearing a table failure"), self.engine.begin() as conn:
            conn.execute(delete(dl_table_failures).where(dl_table_failures.c.table_id == table_id))

    def table_failures(self, table_ids: Sequence[int] | None = None) -> dict[int, TableFailure]:
        """The failing tables among ``table_ids`` (None: all); the row count is the failing tables'."""
        q = select(dl_table_failures)
        chunks: list[Sequence[int] | None] = [None]
        if table_ids is not None:
            ids = sorted(set(table_ids))
            chunks = [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)]
        out: dict[int, TableFailure] = {}
        with db.translated(self.url, "reading table failures"), self.reader.connect() as conn:
            for chunk in chunks:
                stmt = q if chunk is None else q.where(dl_table_failures.c.table_id.in_(list(chunk)))
                for r in conn.execute(stmt):
                    out[int(r.table_id)] = TableFailure(
                        r.error_class,
                        r.message,
                        int(r.first_failed_at),
                        int(r.last_failed_at),
                        int(r.attempts),
                    )
        return out


__all__ = ["TableFailure", "TableFailures", "one_line"]
