"""One Airflow ``Asset`` per mirrored table, the ``extra`` of its events, and reading them back.

A downstream DAG is scheduled on a table's asset and learns which versions became readable::

    from delta_mirror.airflow.assets import published_range, table_asset

    with DAG("daily_report", schedule=[table_asset("orders")], ...):
        @task
        def report(triggering_asset_events=None):
            versions = published_range(triggering_asset_events, "orders")

The asset: name = the table's name; URI = ``x-delta-mirror://<store>/<table>`` (``<store>`` the
table's ``store_conn_id``, ``default`` without one), or the table's ``asset_uri`` from the config
when it names one (e.g. its location, ``s3://lake/orders``, for consumers already scheduled on
that). The ``x-`` scheme is Airflow's mark for a URI it keeps as written: any other scheme makes a
process's first ``Asset`` load every provider's URI handlers (0.8-1.4 s of each DAG-file parse
and task start-up). docs/assets.md says why this URI and not the table's location.

An event's ``extra`` (``EXTRA_KEYS``, written by ``event_extra``): ``table``, ``first_version``
and ``last_version`` published, ``checkpoint_version`` (the newest checkpoint written with them,
or None). Events of a ``publish_in: triggerer`` table come from the triggerer
(``PublishedVersionsTrigger``), which Airflow wraps as ``{"from_trigger": true, "payload": {<the
same keys>}}``; ``published_range`` reads both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote

from airflow.sdk import Asset

from delta_mirror.airflow.asset_extra import EXTRA_KEYS, event_extra
from delta_mirror.table_config import ConfigError, MirrorConfig, TableConfig, load_config

SCHEME = "x-delta-mirror"
#: The ``<store>`` of a table without ``store_conn_id`` (``DELTA_MIRROR_STORE`` or the embedded store).
DEFAULT_STORE = "default"


def asset_uri(cfg: TableConfig) -> str:
    """The table's asset URI (before Airflow's normalisation of a configured ``asset_uri``)."""
    if cfg.asset_uri:
        return cfg.asset_uri
    return f"{SCHEME}://{quote(cfg.store_conn_id or DEFAULT_STORE, safe='')}/{cfg.name}"


def asset_for(cfg: TableConfig) -> Asset:
    """The table's asset; a ``publish_in: triggerer`` table's carries the watcher that emits its
    events from the triggerer. Every DAG file must build it the same way (``table_asset``):
    Airflow keeps the watchers of the copy it parsed last, and a copy without them drops them."""
    watchers = []
    if cfg.event_driven and cfg.publisher == "triggerer":
        from airflow.sdk import AssetWatcher

        from delta_mirror.airflow.triggers import PublishedVersionsTrigger

        trigger = PublishedVersionsTrigger(
            table=cfg.name,
            store_conn_id=cfg.store_conn_id,
            poll_interval=cfg.poll_interval.total_seconds(),
        )
        watchers.append(AssetWatcher(name=f"delta_mirror_{cfg.name}_published", trigger=trigger))
    try:
        return Asset(name=cfg.name, uri=asset_uri(cfg), watchers=watchers)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the asset URI {asset_uri(cfg)!r} is not one Airflow accepts: {exc}",
            table=cfg.name,
            hint="set asset_uri to a URI such as s3://bucket/path, or remove it for the default",
        ) from None


def table_assets(config: MirrorConfig) -> dict[str, Asset]:
    """Every configured table's asset, by table. Two tables whose assets would share a URI (the
    same ``asset_uri`` written differently, or one naming another's default URI) are refused in
    one line naming both, before any DAG is built: an event must say which table moved."""
    assets: dict[str, Asset] = {}
    owner: dict[str, str] = {}
    for name, cfg in sorted(config.tables.items()):
        asset = asset_for(cfg)
        other = owner.setdefault(asset.uri, name)
        if other != name:
            raise ConfigError(
                f"{config.source}: tables '{other}' ({asset_uri(config.tables[other])}) and "
                f"'{name}' ({asset_uri(cfg)}) would have the same asset URI {asset.uri}",
                hint="give one of them another asset_uri (one table, one asset)",
            )
        assets[name] = asset
    return assets


def table_asset(table: str, config: MirrorConfig | str | os.PathLike[str] | None = None) -> Asset:
    """The asset of ``table`` for a downstream DAG's ``schedule`` (or ``inlets``).

    :param config: the table config (a ``MirrorConfig`` or its path); None: ``DELTA_MIRROR_CONFIG``.
        A table the config does not list gets the defaults' store, like every other lookup.
    """
    if not isinstance(config, MirrorConfig):
        from pathlib import Path

        config = load_config(None if config is None else Path(config))
    if table in config.tables:
        return table_assets(config)[table]  # a clashing config fails here too, not only in the DAG file
    return asset_for(config.settings_for(table))


@dataclass(frozen=True)
class PublishedRange:
    """The versions of ``table`` that the events of one consumer run cover.

    Airflow coalesces events: a run queued while more commits were published starts once with all
    of their events, so a run covers ``first_version..last_version`` (``events`` of them), not one
    version. ``checkpoint_version``: the newest checkpoint among them (None: none written).
    """

    table: str
    first_version: int
    last_version: int
    checkpoint_version: int | None
    events: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _extra_of(event: Any) -> Mapping[str, Any]:
    """A task's event carries the keys itself; the triggerer's under ``payload``."""
    extra = getattr(event, "extra", None) or {}
    if extra.get("from_trigger") and isinstance(extra.get("payload"), Mapping):
        return dict(extra["payload"])
    return dict(extra)


def published_range(
    triggering_asset_events: Mapping[Any, Sequence[Any]] | None, table: str
) -> PublishedRange | None:
    """``first..last`` over every triggering event of ``table`` (the run's ``triggering_asset_events``);
    None when none of them is about ``table`` (e.g. a manual run)."""
    extras = [
        extra
        for events in (triggering_asset_events or {}).values()
        for extra in map(_extra_of, events)
        if extra.get("table") == table and extra.get("last_version") is not None
    ]
    if not extras:
        return None
    checkpoints = [int(e["checkpoint_version"]) for e in extras if e.get("checkpoint_version") is not None]
    return PublishedRange(
        table=table,
        first_version=min(int(e["first_version"]) for e in extras),
        last_version=max(int(e["last_version"]) for e in extras),
        checkpoint_version=max(checkpoints) if checkpoints else None,
        events=len(extras),
    )


__all__ = [
    "DEFAULT_STORE",
    "EXTRA_KEYS",
    "SCHEME",
    "PublishedRange",
    "asset_for",
    "asset_uri",
    "event_extra",
    "published_range",
    "table_asset",
    "table_assets",
]
