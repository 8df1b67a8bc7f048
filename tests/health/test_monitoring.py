"""Lag history (``dl_lag_samples``, migration 0002) and ``delta-mirror health``, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from click.testing import CliRunner
from sqlalchemy import update
from support.builders import append_rows, create_data_table

from delta_mirror.cli import cli
from delta_mirror.delta.protocol import now_ms
from delta_mirror.health.monitoring import health_report, lag_history, record_lag_sample, table_detail
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_commits

SCHEMA = pa.schema([("id", pa.int64())])


_table = create_data_table


def _age_commits(store: SqlStore, table_id: int, seconds: float) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            update(dl_commits)
            .where(dl_commits.c.table_id == table_id)
            .values(committed_at=now_ms() - int(seconds * 1000))
        )


def test_lag_samples_record_the_oldest_unpublished_commit_and_are_pruned(
    store: SqlStore, tmp_path: Path
) -> None:
    root = tmp_path / "t"
    _table(store, root)
    info = store.get_table("t")
    Publisher(store).publish("t")
    caught_up = record_lag_sample(store, "t")
    assert (caught_up.lag_seconds, caught_up.versions_behind) == (0.0, 0)

    for i in range(2):
        append_rows(store, root, "t", [i])
    _age_commits(store, info.id, 120)
    behind = record_lag_sample(store, "t")
    assert behind.versions_behind == 2 and 119 <= behind.lag_seconds < 180

    history = lag_history(store, "t")
    assert [h["versions_behind"] for h in history] == [0, 2]
    assert history[0]["sampled_at"] <= history[1]["sampled_at"]

    # Retention: an old sample goes, recent ones stay; other tables are untouched.
    store.add_lag_sample(info.id, 9.0, 9, sampled_at=now_ms() - 3 * 86_400_000)
    _table(store, tmp_path / "u", "u")
    other = store.get_table("u")
    store.add_lag_sample(other.id, 1.0, 1, sampled_at=now_ms() - 3 * 86_400_000)
    assert len(store.lag_samples(info.id)) == 3
    sample = record_lag_sample(store, "t", retention=timedelta(days=1))
    assert sample.pruned == 1
    assert [s[2] for s in store.lag_samples(info.id)] == [0, 2, 2]
    assert len(store.lag_samples(other.id)) == 1
    assert len(store.lag_samples(info.id, limit=2)) == 2

    store.delete_table(info.id)
    assert store.lag_samples(info.id) == []


def _health(store_url: str, *args: str, config: Path | None = None) -> tuple[int, dict[str, Any]]:
    argv = ["--store", store_url, "health", "--json", *args]
    if config is not None:
        argv += ["--config", str(config)]
    result = CliRunner().invoke(cli, argv, env={"DELTA_MIRROR_CONFIG": "/nonexistent/delta_mirror.yaml"})
    return result.exit_code, json.loads(result.stdout)


def test_health_fails_on_lag_slo_breach_halt_and_failures(
    store: SqlStore, store_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "t"
    _table(store, root)
    info = store.get_table("t")
    Publisher(store).publish("t")

    code, report = _health(store_url)
    assert code == 0 and report["healthy"] is True
    (entry,) = report["tables"]
    assert entry["table"] == "t" and entry["lag_slo_seconds"] == 900 and entry["problems"] == []

    # Lag: 10 minutes old and unpublished is inside the default 15m SLO, outside a 5m one.
    append_rows(store, root, "t", [2])
    _age_commits(store, info.id, 600)
    assert _health(store_url)[0] == 0
    cfg = tmp_path / "dm.yaml"
    cfg.write_text("defaults: {lag_slo: 1h}\ntables:\n  t: {lag_slo: 5m}\n")
    code, report = _health(store_url, config=cfg)
    assert code == 1 and report["healthy"] is False
    assert "breaches the lag SLO of 300 s" in report["tables"][0]["problems"][0]
    assert report["tables"][0]["status"]["versions_behind"] == 1
    Publisher(store).publish("t")
    assert _health(store_url, config=cfg)[0] == 0

    # Failures.
    append_rows(store, root, "t", [3])
    store.ensure_status(info.id, 2, "json")
    store.mark_failed(info.id, 2, "json", "FAILED", "TRANSIENT", "simulated throttling")
    code, report = _health(store_url, "t")
    assert code == 1 and "1 failed" in report["tables"][0]["problems"][0]
    assert "simulated throttling" in report["tables"][0]["problems"][0]
    Publisher(store).publish("t")
    assert _health(store_url)[0] == 0

    # Halted.
    store.halt_table(info.id, "conflict at version 3", 3)
    code, report = _health(store_url)
    assert code == 1 and report["tables"][0]["problems"] == ["halted: conflict at version 3"]
    assert health_report(store).healthy is False

    # Text output names the table and the verdict; --record stores a sample.
    result = CliRunner().invoke(
        cli, ["--store", store_url, "health", "--record"], env={"DELTA_MIRROR_CONFIG": "/nonexistent/x.yaml"}
    )
    assert result.exit_code == 1
    assert "FAIL t:" in result.stdout and "UNHEALTHY" in result.stdout
    assert len(store.lag_samples(info.id)) == 1


def test_health_on_an_unknown_table_is_one_error_line(store: SqlStore, store_url: str) -> None:
    result = CliRunner().invoke(cli, ["--store", store_url, "health", "nope"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error:") and "nope" in result.stderr


def test_lag_history_retention_is_a_table_config_duration() -> None:
    import pytest

    from delta_mirror.table_config import ConfigError, parse_config

    cfg = parse_config(
        "defaults: {lag_history_retention: 3d}\ntables:\n  a: {}\n  b: {lag_history_retention: 12h}\n"
    )
    assert cfg.tables["a"].lag_history_retention == timedelta(days=3)
    assert cfg.tables["b"].lag_history_retention == timedelta(hours=12)
    assert parse_config("tables: {c: {}}").tables["c"].lag_history_retention == timedelta(days=14)
    with pytest.raises(ConfigError, match=r"tables\.b\.lag_history_retention: expected a duration"):
        parse_config("tables:\n  b: {lag_history_retention: forever}\n")


def test_a_rewritten_checkpoint_counts_writes_and_is_not_called_retried(
    store: SqlStore, tmp_path: Path
) -> None:
    """A checkpoint rewritten on request (`delta-mirror checkpoint`) is a second write, not a retry;
    a commit file that failed once and was published on the next try is a retry."""
    root = tmp_path / "t"
    _table(store, root)
    info = store.get_table("t")
    publisher = Publisher(store)
    publisher.publish("t")
    append_rows(store, root, "t", [2])
    store.ensure_status(info.id, 1, "json")
    store.mark_started(info.id, [1], "json", "a publisher that hit throttling")  # the first attempt
    store.mark_failed(info.id, 1, "json", "FAILED", "TRANSIENT", "simulated throttling")
    publisher.publish("t")  # the second
    publisher.checkpoint("t", 1)
    publisher.checkpoint("t", 1)  # the deliberate rewrite

    detail = table_detail(store, info)
    (cp,) = detail["checkpoints"]
    assert (cp["version"], cp["state"], cp["writes"]) == (1, "SUCCESS", 2)
    assert "retried" not in cp and "attempts" not in cp
    by_version = {v["version"]: v for v in detail["versions"]}
    assert by_version[1]["retried"] is True and by_version[1]["attempts"] == 2
    assert by_version[0]["retried"] is False
