"""The circuit breaker stops hammering a failing table or endpoint, then lets one run probe it."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from delta_mirror.dev.datafiles import create_table_actions
from delta_mirror.errors import TransientError
from delta_mirror.health.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerPolicy,
    CircuitBreakers,
    CircuitOpenError,
    table_key,
)
from delta_mirror.health.status import table_status
from delta_mirror.jobs.publisher import Publisher, RetryPolicy
from delta_mirror.store import SqlStore

SCHEMA = pa.schema([("id", pa.int64())])
UNREACHABLE = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
    "AWS_ACCESS_KEY_ID": "x",
    "AWS_SECRET_ACCESS_KEY": "y",
}


def _store_with_table(store_url: str, location: str) -> SqlStore:
    store = SqlStore(store_url)
    store.init()
    store.create_table("t", location)
    store.commit(
        "t",
        [
            *create_table_actions(SCHEMA),
        ],
    )
    return store


def test_repeated_transient_failures_open_the_breaker_and_a_later_success_closes_it(
    store_url: str, tmp_path: Path
) -> None:
    store = _store_with_table(store_url, "s3://bucket/t")
    policy = BreakerPolicy(threshold=2, cooldown_seconds=1.0)
    failing = Publisher(
        store, storage_options=UNREACHABLE, retry=RetryPolicy(attempts=1), breaker_policy=policy
    )
    for _ in range(2):
        with pytest.raises(TransientError) as err:
            failing.publish("t")
        assert not isinstance(err.value, CircuitOpenError)
    breakers = CircuitBreakers(store, policy)
    assert breakers.get(table_key("t")).state == OPEN
    assert table_status(store, store.get_table("t")).breaker == OPEN

    started = time.monotonic()
    with pytest.raises(CircuitOpenError, match="circuit breaker table:t is open after 2 consecutive"):
        failing.publish("t")
    assert time.monotonic() - started < 0.5  # refused at once: storage is not contacted

    # After the cool-down one run may probe: the table moved to a reachable folder, it succeeds.
    time.sleep(1.1)
    store.update_table(store.get_table("t").id, location=(tmp_path / "t").as_uri())
    result = Publisher(store, breaker_policy=policy).publish("t")
    assert result.last_published == 0
    assert breakers.get(table_key("t")).state == CLOSED
    assert table_status(store, store.get_table("t")).breaker == CLOSED


def test_a_failed_probe_while_half_open_opens_the_breaker_again(store_url: str) -> None:
    store = _store_with_table(store_url, "s3://bucket/t")
    policy = BreakerPolicy(threshold=1, cooldown_seconds=0.2)
    failing = Publisher(
        store, storage_options=UNREACHABLE, retry=RetryPolicy(attempts=1), breaker_policy=policy
    )
    with pytest.raises(TransientError):
        failing.publish("t")
    breakers = CircuitBreakers(store, policy)
    assert breakers.get(table_key("t")).state == OPEN
    time.sleep(0.3)
    breakers.check(table_key("t"))
    assert breakers.get(table_key("t")).state == HALF_OPEN
    breakers.record_failure(table_key("t"), "still failing")
    state = breakers.get(table_key("t"))
    assert state.state == OPEN and state.last_error == "still failing"


def test_an_open_breaker_makes_health_fail(store_url: str) -> None:
    from delta_mirror.health.monitoring import judge

    store = _store_with_table(store_url, "s3://bucket/t")
    CircuitBreakers(store, BreakerPolicy(threshold=1)).record_failure(table_key("t"), "503 SlowDown")
    health = judge(table_status(store, store.get_table("t")))
    assert not health.healthy
    assert any("circuit breaker OPEN" in p for p in health.problems)


def test_fleet_status_shows_the_endpoint_breaker_on_each_table_behind_it(store_url: str) -> None:
    from delta_mirror.health.breaker import endpoint_key
    from delta_mirror.health.status import fleet_status

    store = _store_with_table(store_url, "s3://bucket/t")
    for name, location in (("u", "s3://bucket/u"), ("w", "s3://other/w")):
        store.create_table(name, location)
    assert [s.breaker for s in fleet_status(store, store.list_tables())] == [CLOSED] * 3
    breakers = CircuitBreakers(store, BreakerPolicy(threshold=1))
    breakers.record_failure(table_key("w"), "503 SlowDown")
    assert [s.breaker for s in fleet_status(store, store.list_tables())] == [CLOSED, CLOSED, OPEN]
    breakers.record_failure(endpoint_key("s3://bucket/t"), "503 SlowDown")
    assert [s.breaker for s in fleet_status(store, store.list_tables())] == [OPEN, OPEN, OPEN]
