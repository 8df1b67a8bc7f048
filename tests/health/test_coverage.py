"""The table config's coverage of the store (health/coverage.py), below the CLI: which tables a DAG
publishes, what their status and health say, and the publisher's refusal of a configured table the
store lacks — on real SQLite and PostgreSQL stores."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import update
from store.store_kit import state as store_state
from support.builders import create_data_table

from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import PermanentError, TableNotFoundError
from delta_mirror.health.coverage import NOT_CONFIGURED, coverage_of, effective_config, not_in_store_error
from delta_mirror.health.monitoring import health_report, judge
from delta_mirror.health.status import fleet_status
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_commits
from delta_mirror.table_config import parse_config

CONFIG = "defaults: {lag_slo: 5m}\ntables:\n  sales: {}\n  orders: {}\n"


@pytest.fixture
def aged(store: SqlStore, tmp_path: Path) -> SqlStore:
    """``sales`` (configured) and ``events`` (not), each one version committed an hour ago, unpublished."""
    for name in ("sales", "events"):
        create_data_table(store, tmp_path / name, name)
    with store.engine.begin() as conn:
        conn.execute(update(dl_commits).values(committed_at=now_ms() - 3_600_000))
    return store


def test_a_table_no_config_lists_is_not_judged_by_its_lag(aged: SqlStore) -> None:
    config = parse_config(CONFIG, "tables.yaml")
    events, sales = fleet_status(aged, aged.list_tables(), coverage=coverage_of(config))

    assert (events.table, events.configured, events.lag_judged) == ("events", False, False)
    assert events.note == (
        f"{NOT_CONFIGURED} (1 version(s) not published) — to mirror it, list it under `tables:` in tables.yaml"
    )
    assert events.versions_behind == 1 and events.lag_seconds >= 3600  # the figures stay
    verdict = judge(events)
    assert verdict.healthy and verdict.problems == [] and verdict.warnings == [events.note]

    assert (sales.configured, sales.note, sales.lag_judged) == (True, None, True)
    assert not judge(sales).healthy and "breaches the lag SLO" in judge(sales).problems[0]


def test_without_a_table_config_nothing_is_known_and_every_lag_counts(aged: SqlStore) -> None:
    assert coverage_of(None) is None
    events = fleet_status(aged, [aged.get_table("events")])[0]
    assert (events.configured, events.note, events.lag_judged) == (None, None, True)
    assert not judge(events).healthy


def test_health_lists_a_configured_table_the_store_lacks_as_a_warning(aged: SqlStore) -> None:
    config = parse_config(CONFIG, "tables.yaml")
    report = health_report(aged, None, config)
    by_name = {t.table: t for t in report.tables}
    assert list(by_name) == ["events", "orders", "sales"]
    orders = by_name["orders"]
    assert orders.healthy and orders.status["in_store"] is False and orders.status["state"] == "NOT_IN_STORE"
    assert orders.warnings[0].startswith(
        "not in store: configured in tables.yaml, but the store has no such table"
    )
    assert [t.table for t in report.tables if not t.healthy] == ["sales"]  # only the configured lag
    with pytest.raises(TableNotFoundError, match=r"table 'orders': not in store: configured in tables\.yaml"):
        health_report(aged, ["orders"], config)


def test_the_publisher_refuses_a_configured_table_the_store_lacks_before_writing(
    store: SqlStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tables.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(path))
    before = (
        store_state(store),
        sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("store.")),
    )

    with pytest.raises(TableNotFoundError) as exc:
        Publisher(store).publish("orders")

    assert isinstance(exc.value, PermanentError) and not exc.value.retryable
    assert exc.value.message == not_in_store_error("orders", effective_config()).message
    assert exc.value.message.startswith(f"table 'orders': not in store: configured in {path}")
    assert "\n" not in exc.value.message
    after = (
        store_state(store),
        sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("store.")),
    )
    assert after == before

    # a name the config does not list: the store's own line
    with pytest.raises(TableNotFoundError, match="no table named 'ordrs' in the store"):
        Publisher(store).publish("ordrs")
