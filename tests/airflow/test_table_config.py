"""The table config (``delta_mirror.table_config``): defaults, inheritance, and refusals that name the key.

A typo must never silently disable an alert or a retry, so every bad value is a ``ConfigError``
whose message names the table and the key (the DAG file shows it as an import error).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from dm_airflow_kit import REPO

from delta_mirror.errors import PermanentError
from delta_mirror.table_config import CheckpointEngine, ConfigError, load_config, parse_config, parse_duration

FULL = """
defaults:
  schedule: "*/5 * * * *"
  owner: data-platform
  retries: 3
  retry_delay: 30s
  retry_exponential_backoff: 2.0
  max_retry_delay: 10m
  lag_slo: 15m
  deadline: 30m
  store_conn_id: dm_store
  notify:
    email: [oncall@example.com]
    smtp_conn_id: smtp_ops
    from_email: mirror@example.com
  maintenance:
    dry_run: true
    schedule: "@daily"
reconcile:
  schedule: 20m
  escalate_after_attempts: 5
monitor:
  schedule: "@hourly"
tables:
  sales:
    schedule: event
    poll_interval: 2s
    tags: [finance]
    aws_conn_id: s3_finance
  orders.v2:
    retries: 0
    lag_slo: 1h
    deadline: null
    validate: false
    notify:
      email: orders@example.com
    maintenance:
      log_retention: 7d
      dry_run: false
  clicks: {}
"""


def test_tables_inherit_the_defaults_and_override_them_key_by_key() -> None:
    cfg = parse_config(FULL)
    assert sorted(cfg.tables) == ["clicks", "orders.v2", "sales"]
    clicks, orders, sales = cfg.tables["clicks"], cfg.tables["orders.v2"], cfg.tables["sales"]
    assert (
        clicks.schedule == "*/5 * * * *" and clicks.retries == 3 and clicks.deadline == timedelta(minutes=30)
    )
    assert clicks.store_conn_id == "dm_store" and clicks.aws_conn_id is None
    assert clicks.notify.email == ("oncall@example.com",) and clicks.notify.smtp_conn_id == "smtp_ops"
    assert sales.event_driven and sales.poll_interval == timedelta(seconds=2) and sales.tags == ("finance",)
    assert sales.aws_conn_id == "s3_finance" and sales.store_conn_id == "dm_store"
    assert orders.retries == 0 and orders.lag_slo == timedelta(hours=1) and orders.deadline is None
    assert orders.validate is False
    # a nested section is merged, not replaced: orders keeps the default smtp connection and sender
    assert orders.notify.email == ("orders@example.com",)
    assert (orders.notify.smtp_conn_id, orders.notify.from_email) == ("smtp_ops", "mirror@example.com")
    assert orders.maintenance.log_retention == timedelta(days=7) and orders.maintenance.dry_run is False
    assert orders.maintenance.schedule == "@daily"
    assert orders.dag_id == "delta_mirror__orders.v2"
    assert cfg.reconcile_schedule == timedelta(minutes=20) and cfg.escalate_after_attempts == 5
    assert cfg.monitor_schedule == "@hourly"


def test_an_empty_config_has_no_tables_and_sane_defaults() -> None:
    cfg = parse_config("")
    assert cfg.tables == {}
    d = cfg.defaults
    assert (d.retries, d.retry_exponential_backoff, d.max_retry_delay) == (3, 2.0, timedelta(minutes=10))
    assert cfg.reconcile_schedule == "*/10 * * * *" and cfg.escalate_after_attempts == 3


def test_the_repository_config_parses() -> None:
    cfg = load_config(REPO / "config" / "delta_mirror.yaml")
    demo = cfg.tables["demo"]
    assert demo.deadline is None and demo.retries == 1 and demo.retry_delay == timedelta(seconds=5)
    assert demo.notify.email == ("data-platform@example.com",)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30),
        ("10m", 600),
        ("2h", 7200),
        ("1d", 86400),
        ("1w", 604800),
        ("1.5h", 5400),
        (45, 45),
    ],
)
def test_durations_take_a_unit_or_seconds(text: object, seconds: float) -> None:
    assert parse_duration(text, "x") == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["soon", "10 minutes", "-5s", -5, True, "", None, "5"])
def test_a_bad_duration_is_refused_with_the_units_to_use(text: object) -> None:
    with pytest.raises(ConfigError, match=r"tables\.t\.lag_slo: expected a duration") as exc:
        parse_duration(text, "tables.t.lag_slo")
    assert "ms, s, m, h, d or w" in str(exc.value) or "30s" in str(exc.value)


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        ("0 * * * *", "0 * * * *"),
        ("@hourly", "@hourly"),
        ("15m", timedelta(minutes=15)),
        (None, None),
        ("event", "event"),
    ],
)
def test_a_table_schedule_is_cron_a_preset_a_duration_event_or_manual(
    schedule: object, expected: object
) -> None:
    text = "tables:\n  t:\n    schedule: " + ("null" if schedule is None else f'"{schedule}"')
    assert parse_config(text).tables["t"].schedule == expected


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("tables: {t: {retrys: 3}}", "tables.t: unknown key(s) ['retrys']"),
        ("tables: {t: {schedule: every hour}}", "tables.t.schedule: schedule 'every hour'"),
        ("tables: {t: {retries: -1}}", "tables.t.retries: expected a non-negative integer"),
        ("tables: {t: {retries: yes}}", "tables.t.retries: expected a non-negative integer"),
        ("tables: {t: {retry_exponential_backoff: fast}}", "tables.t.retry_exponential_backoff"),
        ("tables: {t: {reader: spark3}}", "tables.t.reader: expected deltalake or spark"),
        ("tables: {t: {validate: maybe}}", "tables.t.validate: expected true or false"),
        ("tables: {t: {tags: finance}}", "tables.t.tags: expected a list of strings"),
        ("tables: {t: {owner: null}}", "tables.t.owner: expected a non-empty string"),
        ("tables: {t: {notify: {email: [not-an-address]}}}", "tables.t.notify.email"),
        ("tables: {t: {notify: {emails: [a@b.c]}}}", "tables.t.notify: unknown notify key(s) ['emails']"),
        ("tables: {t: {notify: {notifier: Slack}}}", "tables.t.notify.notifier: expected an import path"),
        (
            "tables: {t: {maintenance: {retention: 7d}}}",
            "tables.t.maintenance: unknown maintenance key 'retention'",
        ),
        ("tables: {t: {maintenance: {schedule: event}}}", "tables.t.maintenance.schedule: 'event'"),
        ("defaults: {lag_slo: soon}", "defaults.lag_slo: expected a duration"),
        ("table: {t: {}}", "unknown top-level key(s) ['table']"),
        ("tables: [t]", "tables must be a mapping"),
        ("reconcile: {escalate_after: 3}", "reconcile: unknown key(s) ['escalate_after']"),
        (
            "reconcile: {escalate_after_attempts: 0}",
            "reconcile.escalate_after_attempts must be a positive integer",
        ),
        ("reconcile: {escalate_after_attempts: true}", "reconcile.escalate_after_attempts"),
        ("monitor: {schedule: event}", "monitor.schedule: 'event'"),
        ("monitor: {slo: 1m}", "monitor: unknown key(s) ['slo']"),
        ("tables: {'bad name!': {}}", "invalid table name 'bad name!'"),
        ("tables: {'../escape': {}}", "invalid table name '../escape'"),
        ('tables: {"t\\n": {}}', "invalid table name 't\\n'"),
        ("tables: {t: {", "is not valid YAML"),
        ("tables: {t: {max_active_runs: 0}}", "tables.t.max_active_runs: expected a positive integer"),
        ("defaults: {max_active_tasks: many}", "defaults.max_active_tasks: expected a positive integer"),
        ("tables: {t: {pool: 3}}", "tables.t.pool: expected a string"),
        ("tables: {t: {priority_weight: -1}}", "tables.t.priority_weight: expected a non-negative integer"),
        ("tables: {t: {tasks: one}}", "tables.t.tasks: expected single or steps, got 'one'"),
        ("defaults: {tasks: true}", "defaults.tasks: expected single or steps, got True"),
        ("tables: {t: {validate_every: often}}", "tables.t.validate_every: expected a duration"),
        (
            "tables: {t: {schedule: event, publish_in: worker}}",
            "tables.t.publish_in: expected task or triggerer",
        ),
        ("tables: {t: {publish_in: triggerer}}", "tables.t.publish_in: 'triggerer' needs 'schedule: event'"),
        (
            "defaults: {publish_in: triggerer}\ntables: {t: {schedule: 10m}}",
            "tables.t.publish_in: 'triggerer' needs 'schedule: event'",
        ),
    ],
)
def test_an_invalid_config_is_refused_naming_the_table_and_key(text: str, named: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "cfg.yaml")
    assert named in str(exc.value)
    assert str(exc.value).startswith("cfg.yaml")
    assert isinstance(exc.value, PermanentError)


def test_the_task_layout_follows_the_schedule_unless_set_and_both_keys_are_inherited() -> None:
    """Unset: one ``sync`` task for an event-driven table, the four steps for a scheduled one."""
    plain = parse_config(
        "tables: {ev: {schedule: event}, cron: {}, ev_steps: {schedule: event, tasks: steps}}"
    ).tables
    assert (plain["ev"].task_layout, plain["cron"].task_layout, plain["ev_steps"].task_layout) == (
        "single",
        "steps",
        "steps",
    )
    assert plain["ev"].validate_every == timedelta(minutes=10)
    inherited = parse_config(
        "defaults: {tasks: single, validate_every: 1h}\ntables: {cron: {}, fast: {validate_every: 0}}"
    ).tables
    assert inherited["cron"].task_layout == "single" and inherited["cron"].validate_every == timedelta(
        hours=1
    )
    assert inherited["fast"].validate_every == timedelta(0)


def test_publish_in_is_inherited_and_unset_means_the_triggerer_for_event_tables_only() -> None:
    tables = parse_config(
        "defaults: {schedule: event, publish_in: triggerer}\n"
        "tables: {a: {}, b: {publish_in: task}, c: {schedule: 5m, publish_in: task}}"
    ).tables
    assert [tables[n].publisher for n in "abc"] == ["triggerer", "task", "task"]
    unset = parse_config("tables: {ev: {schedule: event}, cron: {}, manual: {schedule: null}}").tables
    assert [unset[n].publish_in for n in ("ev", "cron", "manual")] == [None, None, None]
    assert [unset[n].publisher for n in ("ev", "cron", "manual")] == ["triggerer", "task", "task"]
    # a default of `task` stays the choice of the event tables that inherit it
    kept = parse_config("defaults: {publish_in: task}\ntables: {ev: {schedule: event}}").tables
    assert kept["ev"].publisher == "task"


def test_asking_for_an_unconfigured_table_lists_the_configured_ones() -> None:
    with pytest.raises(ConfigError, match="table 'nope' is not in the config") as exc:
        parse_config(FULL, "cfg.yaml").table("nope")
    assert "clicks, orders.v2, sales" in str(exc.value)


def test_load_config_reads_delta_mirror_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("tables: {a: {}}\n")
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(path))
    assert list(load_config().tables) == ["a"]
    assert load_config().source == str(path)
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match=r"cannot read the table config .*missing\.yaml"):
        load_config()


SETTINGS_FOR = """
defaults: {lag_slo: 20m, checkpoint: {engine: auto, spark_threshold_files: 500}}
tables:
  big: {checkpoint: {engine: spark}}
  small: {lag_slo: 5m, checkpoint: {engine: local}}
"""


@pytest.mark.parametrize(
    ("name", "lag_slo", "engine", "threshold"),
    [
        ("big", timedelta(minutes=20), "spark", 500),  # listed: its own engine over the defaults
        ("small", timedelta(minutes=5), "local", 500),
        ("unlisted", timedelta(minutes=20), "auto", 500),  # not listed: the defaults
    ],
)
def test_settings_for_gives_a_listed_table_its_settings_and_any_other_the_defaults(
    name: str, lag_slo: timedelta, engine: str, threshold: int
) -> None:
    settings = parse_config(SETTINGS_FOR).settings_for(name)
    assert settings.name == name  # the defaults answer under the asked name, not "*"
    assert (settings.lag_slo, settings.checkpoint.engine, settings.checkpoint.spark_threshold_files) == (
        lag_slo,
        engine,
        threshold,
    )


@pytest.mark.parametrize(
    ("written", "engine"),
    [
        ("local", CheckpointEngine.LOCAL),
        ("spark", CheckpointEngine.SPARK),
        ("auto", CheckpointEngine.AUTO),
        (None, CheckpointEngine.LOCAL),  # unset: the in-process engine
    ],
)
def test_the_checkpoint_engine_is_read_as_a_checkpoint_engine_member(
    written: str | None, engine: CheckpointEngine
) -> None:
    section = f"checkpoint: {{engine: {written}}}" if written else ""
    cfg = parse_config(f"tables: {{t: {{{section}}}}}").settings_for("t")
    assert cfg.checkpoint.engine is engine
    assert (
        cfg.checkpoint.engine == engine.value
    )  # equal to the bare string, as configs and templates spell it


@pytest.mark.parametrize("bad", ["fast", "Spark", "1", "[local]"])
def test_an_unknown_checkpoint_engine_is_refused_naming_the_three(bad: str) -> None:
    with pytest.raises(
        ConfigError, match=r"tables\.t\.checkpoint\.engine: expected local, spark or auto, got"
    ):
        parse_config(f"tables: {{t: {{checkpoint: {{engine: {bad}}}}}}}")
