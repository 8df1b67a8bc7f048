"""A table that cannot publish is seen at its first failed attempt and judged unhealthy once the
failure outlasts its grace (issue 28), on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from support.builders import create_data_table

from delta_mirror.delta.protocol import now_ms
from delta_mirror.health.monitoring import FailureGrace, health_report, judge, overview_rows
from delta_mirror.health.status import fleet_status
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_table_failures
from delta_mirror.table_config import ConfigError, parse_config


def _table_under_a_regular_file(store: SqlStore, tmp_path: Path) -> None:
    """The issue's case: the location is a folder inside a regular file."""
    create_data_table(store, tmp_path / "data", "t")
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    store.update_table(store.get_table("t").id, location=(blocker / "t").as_uri())


def test_a_location_under_a_regular_file_is_a_recorded_failure_until_the_next_success(
    store_url: str, tmp_path: Path
) -> None:
    store = SqlStore(store_url)
    store.init()
    _table_under_a_regular_file(store, tmp_path)
    with pytest.raises(Exception, match="Not a directory"):
        Publisher(store).publish("t")
    (st,) = fleet_status(store, [store.get_table("t")])
    assert st.failure is not None and st.failure["attempts"] == 1
    assert "Not a directory" in st.failure["error"] and st.failure["error_class"] == "PERMANENT"
    # within the grace: a warning, not yet unhealthy; the overview never says plain OK
    (health,) = health_report(store).tables
    assert health.healthy and "publishing failed 1 attempt(s)" in health.warnings[0]
    (row,) = overview_rows(store, [store.get_table("t")])
    assert row["failure"]["attempts"] == 1 and row["healthy"]

    with pytest.raises(Exception, match="Not a directory"):
        Publisher(store).publish("t")
    (health,) = health_report(store).tables
    assert not health.healthy
    assert any("publishing failed 2 attempt(s) in a row" in p for p in health.problems)
    assert health.to_json()["status"]["failure"]["attempts"] == 2

    # fixed: the next attempt publishes and clears the failure
    store.update_table(store.get_table("t").id, location=(tmp_path / "data").as_uri())
    Publisher(store).publish("t")
    (st,) = fleet_status(store, [store.get_table("t")])
    assert st.failure is None and st.last_published == 0
    assert health_report(store).healthy
    store.close()


def test_the_grace_is_attempts_or_time_whichever_comes_first(store_url: str, tmp_path: Path) -> None:
    store = SqlStore(store_url)
    store.init()
    _table_under_a_regular_file(store, tmp_path)
    with pytest.raises(Exception, match="Not a directory"):
        Publisher(store).publish("t")
    table = store.get_table("t")
    (st,) = fleet_status(store, [table])
    assert judge(st).healthy  # default: 2 attempts or 5 minutes
    assert not judge(st, grace=FailureGrace(timedelta(minutes=5), attempts=1)).healthy
    # six minutes on, one failed attempt is past the default grace
    with store.engine.begin() as conn:
        conn.execute(
            update(dl_table_failures)
            .where(dl_table_failures.c.table_id == table.id)
            .values(first_failed_at=now_ms() - 360_000)
        )
    (st,) = fleet_status(store, [table])
    assert not judge(st).healthy
    assert judge(st, grace=FailureGrace(timedelta(minutes=10), attempts=3)).healthy
    store.close()


def test_the_failure_grace_is_a_table_config_setting() -> None:
    cfg = parse_config(
        "defaults: {failure_grace: 10m}\ntables:\n  a: {}\n  b: {failure_grace: 30s, failure_grace_attempts: 5}\n"
    )
    assert (cfg.tables["a"].failure_grace, cfg.tables["a"].failure_grace_attempts) == (
        timedelta(minutes=10),
        2,
    )
    assert (cfg.tables["b"].failure_grace, cfg.tables["b"].failure_grace_attempts) == (
        timedelta(seconds=30),
        5,
    )
    defaults = parse_config("tables: {c: {}}").tables["c"]
    assert (defaults.failure_grace, defaults.failure_grace_attempts) == (timedelta(minutes=5), 2)
    with pytest.raises(ConfigError, match=r"tables\.b\.failure_grace_attempts"):
        parse_config("tables:\n  b: {failure_grace_attempts: 0}\n")
