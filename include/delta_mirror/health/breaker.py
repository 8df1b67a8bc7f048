"""Circuit breakers per table and per storage endpoint, kept in the store (shared by all workers).

CLOSED → (``threshold`` consecutive transient failures) → OPEN: publishing is refused at once with
``CircuitOpenError`` (transient: Airflow retries later) instead of hammering a failing endpoint →
after ``cooldown`` → HALF_OPEN: one run may try → success closes it, a failure opens it again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import TransientError
from delta_mirror.store.breakers import BreakerState
from delta_mirror.store.sql_store import SqlStore
from delta_mirror.store.states import CircuitState

CLOSED, OPEN, HALF_OPEN = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN


class CircuitOpenError(TransientError):
    """The breaker of a table or endpoint is open: nothing was attempted."""


@dataclass(frozen=True)
class BreakerPolicy:
    threshold: int = 5
    cooldown_seconds: float = 60.0

    @classmethod
    def from_env(cls) -> BreakerPolicy:
        """``DELTA_MIRROR_BREAKER_THRESHOLD`` and ``DELTA_MIRROR_BREAKER_COOLDOWN`` (seconds)."""
        return cls(
            threshold=max(1, int(os.environ.get("DELTA_MIRROR_BREAKER_THRESHOLD", cls.threshold))),
            cooldown_seconds=float(os.environ.get("DELTA_MIRROR_BREAKER_COOLDOWN", cls.cooldown_seconds)),
        )


ENDPOINT_PREFIX = "endpoint:"


def table_key(name: str) -> str:
    return f"table:{name}"


def endpoint_key(location: str, storage_options: Mapping[str, str] | None = None) -> str:
    """One breaker per storage endpoint: the S3 endpoint URL (or bucket), the local disk."""
    parsed = urlparse(location)
    endpoint = (storage_options or {}).get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
    if parsed.scheme in ("s3", "s3a") and endpoint:
        return f"{ENDPOINT_PREFIX}{endpoint.rstrip('/')}"
    if parsed.scheme == "file":
        return f"{ENDPOINT_PREFIX}file://"
    return f"{ENDPOINT_PREFIX}{parsed.scheme}://{parsed.netloc}"


class CircuitBreakers:
    """The state machine above over the breaker rows in the store (``store/breakers.py``)."""

    def __init__(self, store: SqlStore, policy: BreakerPolicy | None = None) -> None:
        self.store = store
        self.policy = policy or BreakerPolicy.from_env()

    def get(self, key: str) -> BreakerState:
        return self.store.breaker(key)

    def check(self, key: str, *, table: str | None = None) -> None:
        """Refuse while OPEN; after the cool-down let one run through (HALF_OPEN)."""
        state = self.get(key)
        if state.state != OPEN:
            return
        reopen_at = (state.opened_at or 0) + int(self.policy.cooldown_seconds * 1000)
        if now_ms() < reopen_at:
            raise CircuitOpenError(
                f"circuit breaker {key} is open after {state.failures} consecutive transient failures "
                f"(last: {state.last_error})",
                table=table,
                hint=f"it half-opens {max(0, reopen_at - now_ms()) // 1000} s from now; check the endpoint's health",
            )
        self._write(key, state=HALF_OPEN)

    def record_success(self, key: str) -> None:
        state = self.get(key)
        if state.state != CLOSED or state.failures:
            self._write(key, state=CLOSED, failures=0, opened_at=None, last_error=None)

    def record_failure(self, key: str, error: str) -> None:
        state = self.get(key)
        failures = state.failures + 1
        opens = state.state == HALF_OPEN or failures >= self.policy.threshold
        self._write(
            key,
            state=OPEN if opens else state.state,
            failures=failures,
            opened_at=now_ms() if opens else state.opened_at,
            last_error=error[:2000],
        )

    def _write(self, key: str, **values: object) -> None:
        self.store.write_breaker(key, **values)


__all__ = [
    "CLOSED",
    "ENDPOINT_PREFIX",
    "HALF_OPEN",
    "OPEN",
    "BreakerPolicy",
    "BreakerState",
    "CircuitBreakers",
    "CircuitOpenError",
    "endpoint_key",
    "table_key",
]
