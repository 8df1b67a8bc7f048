"""Circuit-breaker rows (``dl_breakers``), shared by every worker through the store.

The state machine itself (when a breaker opens, half-opens and closes) is ``health/breaker.py``;
this module only reads and writes the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import insert, select, update

from delta_mirror.delta.protocol import now_ms
from delta_mirror.store import db
from delta_mirror.store.base import StoreBase
from delta_mirror.store.schema import dl_breakers
from delta_mirror.store.states import CircuitState


@dataclass(frozen=True)
class BreakerState:
    key: str
    state: str
    failures: int
    opened_at: int | None
    last_error: str | None


class Breakers(StoreBase):
    """One row per breaker key; an absent row is a closed breaker with no failures."""

    def breaker(self, key: str) -> BreakerState:
        with db.translated(self.url, "reading a circuit breaker"), self.engine.connect() as conn:
            row = conn.execute(select(dl_breakers).where(dl_breakers.c.key == key)).first()
        if row is None:
            return BreakerState(key, CircuitState.CLOSED, 0, None, None)
        return BreakerState(key, row.state, row.failures, row.opened_at, row.last_error)

    def breakers_not_closed(self) -> dict[str, str]:
        """Key → state of every breaker that is not CLOSED (one statement, for fleet-wide status)."""
        with db.translated(self.url, "reading circuit breakers"), self.engine.connect() as conn:
            rows = conn.execute(
                select(dl_breakers.c.key, dl_breakers.c.state).where(
                    dl_breakers.c.state != CircuitState.CLOSED
                )
            )
            return {str(r.key): str(r.state) for r in rows}

    def write_breaker(self, key: str, **values: object) -> None:
        """Update the breaker's row (created closed with no failures first if absent)."""
        values["updated_at"] = now_ms()
        with db.translated(self.url, "updating a circuit breaker"), self.engine.begin() as conn:
            done = conn.execute(update(dl_breakers).where(dl_breakers.c.key == key).values(**values))
            if done.rowcount == 0:
                conn.execute(
                    insert(dl_breakers).values(
                        key=key, **{"state": CircuitState.CLOSED, "failures": 0, **values}
                    )
                )


__all__ = ["BreakerState", "Breakers"]
