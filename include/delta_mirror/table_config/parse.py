"""Reading the table config file: the YAML checked key by key (a refusal names the table and
the key) into ``MirrorConfig``; ``load_config`` finds the file (``DELTA_MIRROR_CONFIG``)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from delta_mirror.table_config.model import (
    DURATION_RE,
    CheckpointEngine,
    CheckpointSettings,
    ConfigError,
    Maintenance,
    MirrorConfig,
    Notify,
    TableConfig,
    parse_duration,
)

_CRON = re.compile(r"^\S+(\s+\S+){4,5}$")
_PRESETS = {"@once", "@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@continuous"}


def _schedule(value: Any, where: str, allow_event: bool = True) -> str | timedelta | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return parse_duration(value, where)
    text = value.strip()
    if text == "event" and not allow_event:
        raise ConfigError(
            f"{where}: 'event' schedules only a table's DAG (it polls that table's commits)",
            hint="use a cron expression, a preset, a duration or null here",
        )
    if text == "event" or text in _PRESETS or _CRON.match(text):
        return text
    if DURATION_RE.match(text):
        return parse_duration(text, where)
    raise ConfigError(
        f"{where}: schedule {value!r} is not a cron expression, a preset, a duration or 'event'",
        hint="e.g. '*/5 * * * *', '@hourly', '10m', 'event', or null for manual runs",
    )


_TABLE_KEYS = {f.name for f in fields(TableConfig)} - {"name"}


def _check_keys(raw: Any, allowed: set[str], where: str, *, not_a_mapping: str, keys: str = "key(s)") -> None:
    """``raw`` is a mapping of ``allowed`` keys only; else one refusal (``not_a_mapping``, or the
    unknown ``keys`` with the allowed ones as the hint)."""
    if not isinstance(raw, dict):
        raise ConfigError(not_a_mapping)
    unknown = set(raw) - allowed
    if unknown:
        raise ConfigError(f"{where}: unknown {keys} {sorted(unknown)}", hint=f"allowed: {sorted(allowed)}")


def _notify(raw: Any, base: Notify, where: str) -> Notify:
    _check_keys(
        raw,
        {f.name for f in fields(Notify)},
        where,
        not_a_mapping=f"{where}: notify must be a mapping",
        keys="notify key(s)",
    )
    values: dict[str, Any] = {}
    for key, val in raw.items():
        if key == "email":
            emails = [val] if isinstance(val, str) else val
            if not isinstance(emails, list) or not all(isinstance(e, str) and "@" in e for e in emails):
                raise ConfigError(f"{where}.email: expected an address or a list of addresses, got {val!r}")
            values[key] = tuple(emails)
        elif key == "notifier_kwargs":
            if not isinstance(val, dict):
                raise ConfigError(f"{where}.notifier_kwargs must be a mapping")
            values[key] = dict(val)
        elif key == "notifier":
            if val is not None and (not isinstance(val, str) or "." not in val):
                raise ConfigError(
                    f"{where}.notifier: expected an import path like pkg.module.Class, got {val!r}"
                )
            values[key] = val
        else:
            if not isinstance(val, str):
                raise ConfigError(f"{where}.{key}: expected a string, got {val!r}")
            values[key] = val
    return replace(base, **values)


def _maintenance(raw: Any, base: Maintenance, where: str) -> Maintenance:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: maintenance must be a mapping")
    values: dict[str, Any] = {}
    for key, val in raw.items():
        check = _MAINTENANCE_KEYS.get(key)
        if check is None:
            raise ConfigError(
                f"{where}: unknown maintenance key '{key}'", hint="allowed: " + ", ".join(_MAINTENANCE_KEYS)
            )
        values[key] = check(val, f"{where}.{key}")
    return replace(base, **values)


def _positive_int(val: Any, at: str, minimum: int = 1) -> int:
    """An integer of at least ``minimum`` (``true``/``false`` are not numbers here)."""
    if not isinstance(val, int) or isinstance(val, bool) or val < minimum:
        kind = "a positive integer" if minimum > 0 else "a non-negative integer"
        raise ConfigError(f"{at}: expected {kind}, got {val!r}")
    return val


def _non_empty_str(val: Any, at: str) -> str:
    if not isinstance(val, str) or not val.strip():
        raise ConfigError(f"{at}: expected a non-empty string, got {val!r}")
    return val


def _spark(raw: Any, where: str) -> dict[str, Any]:
    """``checkpoint.spark`` (conn_id, master, partitions, conf) as ``CheckpointSettings`` fields."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}.spark: expected a mapping (conn_id, master, partitions, conf)")
    values: dict[str, Any] = {}
    for skey, sval in raw.items():
        at = f"{where}.spark.{skey}"
        if skey in ("conn_id", "master"):
            values[f"spark_{skey}"] = _non_empty_str(sval, at)
        elif skey == "partitions":
            values["spark_partitions"] = _positive_int(sval, at)
        elif skey == "conf":
            if not isinstance(sval, dict) or not all(isinstance(k, str) for k in sval):
                raise ConfigError(f"{at}: expected a mapping of Spark settings")
            values["spark_conf"] = {k: str(v) for k, v in sval.items()}
        else:
            raise ConfigError(
                f"{where}.spark: unknown key '{skey}'",
                hint="allowed: conf, conn_id, master, partitions",
            )
    return values


def _checkpoint(raw: Any, base: CheckpointSettings, where: str) -> CheckpointSettings:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: checkpoint must be a mapping")
    values: dict[str, Any] = {}
    for key, val in raw.items():
        if key == "engine":
            engine = CheckpointEngine.named(val)
            if engine is None:
                raise ConfigError(f"{where}.engine: expected {CheckpointEngine.choices()}, got {val!r}")
            values[key] = engine
        elif key == "spark_threshold_files":
            values[key] = _positive_int(val, f"{where}.spark_threshold_files")
        elif key == "spark":
            values.update(_spark(val, where))
        else:
            raise ConfigError(
                f"{where}: unknown checkpoint key '{key}'",
                hint="allowed: engine, spark, spark_threshold_files",
            )
    return replace(base, **values)


def _backoff(val: Any, at: str) -> float:
    if isinstance(val, bool) or not isinstance(val, int | float) or val < 0:
        raise ConfigError(f"{at}: expected a multiplier such as 2.0 (0 disables), got {val!r}")
    return float(val)


def _flag(val: Any, at: str) -> bool:
    if not isinstance(val, bool):
        raise ConfigError(f"{at}: expected true or false, got {val!r}")
    return val


#: How each ``maintenance`` key is checked and converted.
_MAINTENANCE_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "dry_run": _flag,
    "log_retention": parse_duration,
    "schedule": lambda val, at: _schedule(val, at, allow_event=False),
}


def _one_of(
    allowed: tuple[str, ...], *, hint: str | None = None, optional: bool = False
) -> Callable[[Any, str], str | None]:
    """The check of a setting that names one of ``allowed`` (or is null, when ``optional``): one
    refusal naming them all."""

    def check(val: Any, at: str) -> str | None:
        if optional and val is None:
            return None
        if val not in allowed:
            names = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
            raise ConfigError(f"{at}: expected {names}, got {val!r}", hint=hint)
        return str(val)

    return check


_READERS = ("deltalake", "spark")  # the DAG validate step's reader
TASK_LAYOUTS = ("single", "steps")
PUBLISH_IN = ("task", "triggerer")


def _tags(val: Any, at: str) -> tuple[str, ...]:
    if not isinstance(val, list) or not all(isinstance(t, str) for t in val):
        raise ConfigError(f"{at}: expected a list of strings")
    return tuple(val)


def _optional_str(val: Any, at: str) -> str | None:
    if val is not None and not isinstance(val, str):
        raise ConfigError(f"{at}: expected a string, got {val!r}")
    return val


#: How each plain table setting is checked and converted (``notify``, ``maintenance`` and
#: ``checkpoint`` are sections, merged over the inherited ones in ``_apply``).
_TABLE_VALUES: dict[str, Callable[[Any, str], Any]] = {
    "schedule": _schedule,
    "poll_interval": parse_duration,
    "retry_delay": parse_duration,
    "max_retry_delay": parse_duration,
    "lag_slo": parse_duration,
    "lag_history_retention": parse_duration,
    "failure_grace": parse_duration,
    "failure_grace_attempts": _positive_int,
    "deadline": lambda val, at: None if val is None else parse_duration(val, at),
    "retries": lambda val, at: _positive_int(val, at, minimum=0),
    "retry_exponential_backoff": _backoff,
    "owner": _non_empty_str,
    "validate": _flag,
    "reader": _one_of(_READERS),
    "tags": _tags,
    "store_conn_id": _optional_str,
    "aws_conn_id": _optional_str,
    "max_active_runs": _positive_int,
    "max_active_tasks": lambda val, at: None if val is None else _positive_int(val, at),
    "pool": _optional_str,
    "priority_weight": lambda val, at: _positive_int(val, at, minimum=0),
    "tasks": _one_of(
        TASK_LAYOUTS,
        optional=True,
        hint="single: one `sync` task per run; steps: publish, checkpoint, validate, metrics; "
        "null: single for `schedule: event` tables, steps otherwise",
    ),
    "validate_every": parse_duration,
    "asset_uri": _optional_str,
    "publish_in": _one_of(
        PUBLISH_IN,
        optional=True,
        hint="task: the DAG run publishes each commit; triggerer: the event watcher publishes it "
        "(schedule: event tables only); null: triggerer for schedule: event tables",
    ),
}


def _apply(base: TableConfig, raw: Any, where: str) -> TableConfig:
    """``raw`` settings over ``base`` (the defaults, for a table), each checked."""
    if raw is None:
        return base
    _check_keys(raw, _TABLE_KEYS, where, not_a_mapping=f"{where}: expected a mapping of settings")
    values: dict[str, Any] = {}
    for key, val in raw.items():
        at = f"{where}.{key}"
        if key == "notify":
            values[key] = _notify(val, base.notify, at)
        elif key == "maintenance":
            values[key] = _maintenance(val, base.maintenance, at)
        elif key == "checkpoint":
            values[key] = _checkpoint(val, base.checkpoint, at)
        else:
            values[key] = _TABLE_VALUES[key](val, at)
    return replace(base, **values)


def default_config_path() -> Path:
    env = os.environ.get("DELTA_MIRROR_CONFIG")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "config" / "delta_mirror.yaml"


def _tables(raw_tables: dict[Any, Any], defaults: TableConfig, source: str) -> dict[str, TableConfig]:
    """Each table's settings over the defaults; a table name must be one the store accepts."""
    # Imported here: the CLI reads ``CheckpointEngine`` at start-up, before any store (SQLAlchemy) loads.
    from delta_mirror.store.tables import TABLE_NAME

    tables: dict[str, TableConfig] = {}
    for name, settings in raw_tables.items():
        if not isinstance(name, str) or not TABLE_NAME.fullmatch(name):
            raise ConfigError(
                f"{source}: invalid table name {name!r}", hint="use letters, digits, '_', '.' or '-'"
            )
        where = f"{source}: tables.{name}"
        tables[name] = cfg = _apply(replace(defaults, name=name), settings, where)
        if cfg.publish_in == "triggerer" and not cfg.event_driven:
            raise ConfigError(
                f"{where}.publish_in: 'triggerer' needs 'schedule: event' (the schedule is {cfg.schedule!r})",
                hint="set schedule: event on this table, or publish_in: task (its scheduled runs publish)",
            )
    return tables


def parse_config(text: str, source: str = "<string>") -> MirrorConfig:
    """Validate a config document; raises ``ConfigError`` naming the bad table and key."""
    # Imported here: a command that finds no config file (``mirror`` on its defaults) never loads it.
    import yaml

    # libyaml's safe loader when PyYAML has it: the config is read at every DAG parse and task
    # start-up, and with 1,000 tables the pure-Python loader takes about 0.3 s of it (7x the C one)
    loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        raw = yaml.load(text, Loader=loader) or {}  # a safe loader (C or Python)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping with 'defaults' and 'tables'")
    unknown = set(raw) - {"defaults", "tables", "reconcile", "monitor"}
    if unknown:
        raise ConfigError(
            f"{source}: unknown top-level key(s) {sorted(unknown)}",
            hint="allowed: defaults, tables, reconcile, monitor",
        )
    defaults = _apply(TableConfig(name="*"), raw.get("defaults"), f"{source}: defaults")
    if defaults.asset_uri is not None:
        raise ConfigError(
            f"{source}: defaults.asset_uri: an asset URI names one table's asset",
            hint="set asset_uri under the table it names (docs/assets.md)",
        )
    raw_tables = raw.get("tables") or {}
    if not isinstance(raw_tables, dict):
        raise ConfigError(f"{source}: tables must be a mapping of table name to settings")
    tables = _tables(raw_tables, defaults, source)
    reconcile = raw.get("reconcile") or {}
    monitor = raw.get("monitor") or {}
    for section_name, section, allowed in (
        ("reconcile", reconcile, {"schedule", "escalate_after_attempts", "strategy"}),
        ("monitor", monitor, {"schedule"}),
    ):
        where = f"{source}: {section_name}"
        _check_keys(section, allowed, where, not_a_mapping=f"{where} must be a mapping")
    escalate = reconcile.get("escalate_after_attempts", 3)
    if not isinstance(escalate, int) or isinstance(escalate, bool) or escalate < 1:
        raise ConfigError(
            f"{source}: reconcile.escalate_after_attempts must be a positive integer, got {escalate!r}"
        )

    strategy = reconcile.get("strategy", "smart")
    if strategy not in ("incremental", "full", "smart"):
        raise ConfigError(
            f"{source}: reconcile.strategy must be incremental, full or smart, got {strategy!r}"
        )

    def sched(section_name: str, section: dict[str, Any], default: str) -> str | timedelta | None:
        return _schedule(
            section.get("schedule", default), f"{source}: {section_name}.schedule", allow_event=False
        )

    return MirrorConfig(
        tables=tables,
        defaults=defaults,
        reconcile_schedule=sched("reconcile", reconcile, "*/10 * * * *"),
        monitor_schedule=sched("monitor", monitor, "*/5 * * * *"),
        escalate_after_attempts=escalate,
        reconcile_strategy=strategy,
        source=source,
    )


def load_config(path: Path | None = None) -> MirrorConfig:
    path = path or default_config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the table config {path}: {exc.strerror}",
            hint="create it or point DELTA_MIRROR_CONFIG at it",
        ) from None
    return parse_config(text, str(path))


__all__ = ["PUBLISH_IN", "TASK_LAYOUTS", "default_config_path", "load_config", "parse_config"]
