"""DAGs generated from the table config (re-read at every parse: edits need no restart).

- ``delta_mirror__<table>``: on the table's schedule or event-driven (an ``AssetWatcher`` polling
  the store), with retries, a ``DeadlineAlert`` and failure notifications; ``tasks: single`` (the
  default for event-driven tables) runs one ``sync`` task (publish, checkpoint when due, validate
  on the table's cadence, lag sample: one task start-up per run), ``tasks: steps`` runs
  publish → checkpoint → validate → metrics as separate tasks; the publishing task (``publish``
  or ``sync``) has the table's asset as its outlet (``assets``: an event when it published);
- ``delta_mirror_reconcile``: re-drives failed/stuck/lagging versions; escalates persistent failures;
- ``delta_mirror_backfill``: manual, a ``Param`` form (table, version range, steps);
- ``delta_mirror_monitor``: lag metrics and lag-SLO breach emails; ``validate``: the tables published
  in the triggerer (``publish_in: triggerer``, the default for event tables), each on its
  ``validate_every`` cadence;
- ``delta_mirror_maintenance``: log cleanup by retention (dry-run by default).
"""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from typing import Any

from airflow.sdk import (  # type: ignore[attr-defined]  # airflow/sdk/__init__.pyi omits the deadline names
    DAG,
    Asset,
    AssetWatcher,
    AsyncCallback,
    DeadlineAlert,
    DeadlineReference,
    Param,
    task,
)

from delta_mirror.airflow.assets import asset_for, table_assets
from delta_mirror.airflow.dag_defaults import (
    BASE_TAGS,
    JUST_PUBLISHED_FROM,
    JUST_PUBLISHED_TO,
    START,
    STEPS,
    airflow_dag_settings,
    conn_args,
    default_args,
    fleet_dag,
    numbered,
)
from delta_mirror.airflow.examples import example_dags
from delta_mirror.airflow.notifications import deadline_missed, send
from delta_mirror.airflow.operators import (
    DeltaMirrorCheckpointOperator,
    DeltaMirrorFleetValidateOperator,
    DeltaMirrorLagOperator,
    DeltaMirrorMaintenanceOperator,
    DeltaMirrorPublishOperator,
    DeltaMirrorReconcileOperator,
    DeltaMirrorSyncOperator,
    DeltaMirrorValidateOperator,
)
from delta_mirror.airflow.triggers import StoreCommitTrigger
from delta_mirror.table_config import CheckpointEngine, MirrorConfig, TableConfig, load_config


def _by_connections(config: MirrorConfig, aws: bool = True) -> list[tuple[dict[str, Any], list[str]]]:
    """Tables grouped by their connections: one reconcile/lag task per store (and bucket credentials).

    Without tables: one group with the defaults' connections and every table in that store.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    for name, cfg in sorted(config.tables.items()):
        key = (cfg.store_conn_id or "", (cfg.aws_conn_id or "") if aws else "")
        groups.setdefault(key, []).append(name)
    if not groups:
        d = config.defaults
        groups[(d.store_conn_id or "", (d.aws_conn_id or "") if aws else "")] = []
    out = []
    for (store, bucket), names in groups.items():
        conn: dict[str, Any] = {"store_conn_id": store or None}
        if aws:
            conn["aws_conn_id"] = bucket or None
        out.append((conn, names))
    return out


def _per_table(config: MirrorConfig, attr: str) -> str | None:
    """A connection id for the table picked in the backfill form: a constant, or a template by table."""
    ids = {name: getattr(cfg, attr) or "" for name, cfg in config.tables.items()}
    distinct = set(ids.values())
    if len(distinct) <= 1:
        value = distinct.pop() if distinct else getattr(config.defaults, attr)
        return value or None
    return "{{ " + json.dumps(ids, sort_keys=True) + ".get(params.table, '') }}"


def _schedule(cfg: TableConfig) -> Any:
    """An event-driven table is scheduled by its commits asset. The URI's ``x-`` scheme is
    Airflow's mark for a scheme it need not normalise: any other makes the first ``Asset`` of a
    process load every provider's URI handlers (the Amazon provider's S3 hooks among them), about
    1.4 s of each DAG-file parse and of each event-driven task's start-up."""
    if cfg.event_driven:
        in_triggerer = cfg.publisher == "triggerer"
        trigger = StoreCommitTrigger(
            table=cfg.name,
            store_conn_id=cfg.store_conn_id,
            poll_interval=cfg.poll_interval.total_seconds(),
            publish=in_triggerer,
            aws_conn_id=cfg.aws_conn_id if in_triggerer else None,
        )
        asset = Asset(
            name=f"delta_mirror_{cfg.name}_commits",
            uri=f"x-delta-mirror://commits/{cfg.name}",
            watchers=[AssetWatcher(name=f"delta_mirror_{cfg.name}_watcher", trigger=trigger)],
        )
        return [asset]
    return cfg.schedule


def _checkpoint_task(cfg: TableConfig) -> Any:
    """``spark``: spark-submit the checkpoint job (apache-spark provider, ``checkpoint.spark.conn_id``);
    ``local`` / ``auto``: in the worker (``auto`` starts Spark there above the file threshold)."""
    settings = cfg.checkpoint
    if settings.engine == CheckpointEngine.SPARK:
        from delta_mirror.airflow.operators.spark_submit import DeltaMirrorSparkCheckpointOperator

        return DeltaMirrorSparkCheckpointOperator(
            task_id="checkpoint",
            table=cfg.name,
            conn_id=settings.spark_conn_id,
            conf=dict(settings.spark_conf),
            partitions=settings.spark_partitions,
            **conn_args(cfg),
        )
    return DeltaMirrorCheckpointOperator(
        task_id="checkpoint", table=cfg.name, engine=settings.engine, **conn_args(cfg)
    )


def _airflow_settings(cfg: TableConfig) -> dict[str, Any]:
    """Airflow's per-DAG defaults read once, and the table's ``max_active_tasks`` over Airflow's
    ``core.max_active_tasks_per_dag``."""
    settings = dict(airflow_dag_settings())
    if cfg.max_active_tasks:
        settings["max_active_tasks"] = cfg.max_active_tasks
    return settings


def _doc(cfg: TableConfig) -> str:
    if cfg.task_layout == "single":
        what = (
            "one `sync` task publishes every pending version, checkpoints when due, validates the new "
            f"versions ({cfg.reader}, every {cfg.validate_every if cfg.validate else 'never'}) and records the lag"
        )
    else:
        what = (
            "publish → checkpoint (when due) "
            f"→ validate the versions just published ({cfg.reader}) → lag metrics"
        )
    if cfg.event_driven and cfg.publisher == "triggerer":
        what = (
            "the event watcher publishes each commit in the triggerer; a run starts only when a checkpoint "
            f"is due or publishing there failed ({what}); the monitor DAG validates on the table's cadence"
        )
    return (
        f"Publishes the Delta log of **{cfg.name}** from the SQL store: {what}. "
        f"Schedule: `{cfg.schedule}`; lag SLO {cfg.lag_slo}; deadline {cfg.deadline}."
    )


def table_dag(cfg: TableConfig, asset: Asset | None = None) -> DAG:
    """The table's DAG; its publishing task (``publish`` or ``sync``) has the table's ``asset``
    (None: ``assets.asset_for(cfg)``) as its outlet."""
    asset = asset or asset_for(cfg)
    deadline = None
    if cfg.deadline is not None:
        deadline = DeadlineAlert(
            reference=DeadlineReference.DAGRUN_QUEUED_AT,
            interval=cfg.deadline,
            callback=AsyncCallback(
                deadline_missed, kwargs={"table": cfg.name, "deadline": str(cfg.deadline)}
            ),
        )
    with DAG(
        dag_id=cfg.dag_id,
        schedule=_schedule(cfg),
        start_date=START,
        catchup=False,
        max_active_runs=cfg.max_active_runs,
        **_airflow_settings(cfg),
        default_args=default_args(cfg),
        tags=[*BASE_TAGS, "table", *cfg.tags],
        deadline=deadline,
        doc_md=_doc(cfg),
    ) as dag:
        tasks = _single_tasks(cfg, asset) if cfg.task_layout == "single" else _step_tasks(cfg, asset)
        for upstream, downstream in itertools.pairwise(tasks):
            upstream >> downstream
    return dag


def _single_tasks(cfg: TableConfig, asset: Asset) -> list[Any]:
    """One ``sync`` task; with the Spark engine its spark-submit checkpoint task follows."""
    engine = cfg.checkpoint.engine
    sync = DeltaMirrorSyncOperator(
        task_id="sync",
        table=cfg.name,
        checkpoint_engine=engine,
        validate_every=cfg.validate_every.total_seconds() if cfg.validate else None,
        reader=cfg.reader,
        lag_history_retention=cfg.lag_history_retention.total_seconds(),
        publish_in=cfg.publisher,  # triggerer: a lease its trigger holds is waited for
        outlets=[asset],
        **conn_args(cfg),
    )
    return [sync, _checkpoint_task(cfg)] if engine == CheckpointEngine.SPARK else [sync]


def _step_tasks(cfg: TableConfig, asset: Asset) -> list[Any]:
    """publish → checkpoint → validate (the versions just published) → metrics."""
    engine = cfg.checkpoint.engine
    # with another engine the publish step leaves the cadence's checkpoints to the next step
    publish = DeltaMirrorPublishOperator(
        task_id="publish",
        table=cfg.name,
        cadence_checkpoints=engine == CheckpointEngine.LOCAL,
        outlets=[asset],
        **conn_args(cfg),
    )
    tasks: list[Any] = [publish, _checkpoint_task(cfg)]
    if cfg.validate:
        tasks.append(
            DeltaMirrorValidateOperator(
                task_id="validate",
                table=cfg.name,
                reader=cfg.reader,
                **conn_args(cfg),
                from_version=JUST_PUBLISHED_FROM,
                to_version=JUST_PUBLISHED_TO,
            )
        )
    tasks.append(
        DeltaMirrorLagOperator(
            task_id="metrics",
            tables=[cfg.name],
            store_conn_id=cfg.store_conn_id,
            lag_history_retention=cfg.lag_history_retention.total_seconds(),
        )
    )
    return tasks


def reconcile_dag(config: MirrorConfig) -> DAG:
    with fleet_dag(
        "delta_mirror_reconcile",
        config.defaults,
        schedule=config.reconcile_schedule,
        tags=["reconcile"],
        doc_md="Finds FAILED, stuck (lease expired) and lagging versions across the configured tables and "
        "re-drives them; emails the table's contacts when failures persist "
        f"(≥ {config.escalate_after_attempts} attempts), a table's publish attempts keep failing past "
        "its failure grace, or a table is halted.",
    ) as dag:
        reports = [
            DeltaMirrorReconcileOperator(
                task_id=numbered("reconcile", i),
                tables=names or None,
                escalate_after_attempts=config.escalate_after_attempts,
                strategy=config.reconcile_strategy,
                **conn,
            )
            for i, (conn, names) in enumerate(_by_connections(config))
        ]

        @task(task_id="escalate")
        def escalate(results: list[dict[str, Any]]) -> list[str]:
            from delta_mirror.delta.protocol import now_ms
            from delta_mirror.health.monitoring import FailureGrace, failure_text

            cfg = load_config()
            sent = []
            for entry in [e for result in results for e in result["tables"]]:
                table = cfg.settings_for(entry["table"])
                # publish attempts failing past the table's failure grace (location, credentials, ...)
                failing = entry.get("table_failure")
                grace = FailureGrace(table.failure_grace, table.failure_grace_attempts)
                failing = failing if failing and grace.passed(failing, now_ms()) else None
                if not entry["persistent_failures"] and entry["action"] != "halted" and not failing:
                    continue
                lines = [f"Table: {entry['table']}", f"State: {entry['action']}"]
                if entry.get("error"):
                    lines.append(f"Error: {entry['error']}")
                if failing:
                    lines.append(f"Publishing: {failure_text(failing)}")
                for f in entry["persistent_failures"]:
                    lines.append(
                        f"- version {f['version']} ({f['artifact']}): {f['attempts']} attempt(s), "
                        f"[{f['error_class']}] {f['error']}"
                    )
                lines.append(
                    "What to do: see docs/troubleshooting.md for the error class; fix the cause, "
                    f"then `delta-mirror resume {entry['table']}` if halted."
                )
                send(
                    table.notify,
                    f"[delta-mirror] {entry['table']}: persistent publish failures",
                    "\n".join(lines),
                )
                sent.append(entry["table"])
            return sent

        # @task types its call with the resolved values; at DAG-build time they are XComArgs.
        escalate([r.output for r in reports])  # type: ignore[misc]
    return dag


def backfill_dag(config: MirrorConfig) -> DAG:
    tables = sorted(config.tables)
    with fleet_dag(
        "delta_mirror_backfill",
        config.defaults,
        tags=["backfill"],
        max_active_runs=None,  # runs for different tables may overlap
        params={
            "table": Param(
                tables[0] if tables else "",
                type="string",
                enum=tables or [""],
                description="A configured table.",
            ),
            "from_version": Param(
                None, type=["null", "integer"], minimum=0, description="First version (validate)."
            ),
            "to_version": Param(
                None,
                type=["null", "integer"],
                minimum=0,
                description="Last version (default: the latest committed).",
            ),
            "steps": Param(
                STEPS,
                type="array",
                items={"type": "string", "enum": STEPS},
                uniqueItems=True,
                description="Which steps to run.",
            ),
        },
        doc_md="Manual version-range runs for one table: publish up to `to_version`, checkpoint at it, validate "
        "`from_version..to_version`. Trigger from the UI form, `airflow dags trigger -c '{...}'` or the REST API.",
    ) as dag:

        @task(task_id="check_params")
        def check_params(params: dict[str, Any] | None = None) -> dict[str, Any]:
            from delta_mirror.airflow.backfill import check_backfill_params

            return check_backfill_params(params or {}, tables)

        checked = check_params()
        common: dict[str, Any] = {
            "table": "{{ params.table }}",
            "store_conn_id": _per_table(config, "store_conn_id"),
            "aws_conn_id": _per_table(config, "aws_conn_id"),
        }
        publish = DeltaMirrorPublishOperator(
            task_id="publish",
            to_version="{{ params.to_version }}",
            enabled="{{ 'publish' in params.steps }}",
            **common,
        )
        checkpoint = DeltaMirrorCheckpointOperator(
            task_id="checkpoint",
            version="{{ params.to_version }}",
            only_if_due=False,
            enabled="{{ 'checkpoint' in params.steps }}",
            trigger_rule="none_failed",
            **common,
        )
        validate = DeltaMirrorValidateOperator(
            task_id="validate",
            from_version="{{ params.from_version }}",
            to_version="{{ params.to_version }}",
            enabled="{{ 'validate' in params.steps }}",
            trigger_rule="none_failed",
            **common,
        )
        checked >> publish >> checkpoint >> validate
    return dag


def monitor_dag(config: MirrorConfig) -> DAG:
    defaults = config.defaults
    with fleet_dag(
        "delta_mirror_monitor",
        defaults,
        schedule=config.monitor_schedule,
        tags=["monitor"],
        doc_md="Lag per table (seconds since the oldest unpublished commit, versions behind) as Airflow "
        "metrics; emails a table's contacts when its lag breaches the lag SLO in the config.",
    ) as dag:
        lags = [
            DeltaMirrorLagOperator(
                task_id=numbered("lag", i),
                tables=names or None,
                lag_history_retention={
                    n: config.tables[n].lag_history_retention.total_seconds() for n in names
                }
                or defaults.lag_history_retention.total_seconds(),
                **conn,
            )
            for i, (conn, names) in enumerate(_by_connections(config, aws=False))
        ]

        @task(task_id="check_slo")
        def check_slo(results: list[list[dict[str, Any]]]) -> list[str]:
            cfg = load_config()
            breached = []
            for status in [s for statuses in results for s in statuses]:
                table = cfg.tables.get(str(status["table"]))
                if table is None:
                    continue
                slo = table.lag_slo.total_seconds()
                if float(status["lag_seconds"]) > slo:
                    breached.append(table.name)
                    send(
                        table.notify,
                        f"[delta-mirror] {table.name}: lag SLO breached "
                        f"({float(status['lag_seconds']):.0f} s > {slo:.0f} s)",
                        f"Table: {table.name}\nLag: {status['lag_seconds']} s "
                        f"({status['versions_behind']} version(s) behind)\nSLO: {slo:.0f} s\n"
                        f"Published: {status['last_published']}  Committed: {status['latest_committed']}\n"
                        f"State: {status['state']}  Last error: {status.get('last_error')}\n"
                        "What to do: check the table's DAG runs and `delta-mirror status`; the reconcile DAG "
                        "re-drives failed versions.",
                    )
            return breached

        check_slo([lag.output for lag in lags])  # type: ignore[misc]  # XComArgs, resolved at run time
        _fleet_validate_tasks(config)
    return dag


def _fleet_validate_tasks(config: MirrorConfig) -> list[Any]:
    """Validation of the tables published in the triggerer (no per-commit run validates them): one
    task per store and storage connection, each table on its own cadence (``validate_every``)."""
    groups: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for name, cfg in sorted(config.tables.items()):
        if cfg.event_driven and cfg.publisher == "triggerer" and cfg.validate:
            key = (cfg.store_conn_id or "", cfg.aws_conn_id or "")
            every = cfg.validate_every.total_seconds()
            groups.setdefault(key, {})[name] = {"every": every, "reader": cfg.reader}
    return [
        DeltaMirrorFleetValidateOperator(
            task_id=numbered("validate", i),
            tables=tables,
            store_conn_id=store or None,
            aws_conn_id=bucket or None,
        )
        for i, ((store, bucket), tables) in enumerate(groups.items())
    ]


def maintenance_dag(config: MirrorConfig) -> DAG:
    defaults = config.defaults
    with fleet_dag(
        "delta_mirror_maintenance",
        defaults,
        schedule=defaults.maintenance.schedule,
        tags=["maintenance"],
        doc_md="Log and checkpoint cleanup by each table's retention (`delta.logRetentionDuration`), keeping "
        "the newest checkpoint older than the cutoff and its commit. Dry-run unless the config says "
        "`maintenance: {dry_run: false}`.",
    ) as dag:
        for name, cfg in sorted(config.tables.items()):
            retention = cfg.maintenance.log_retention
            DeltaMirrorMaintenanceOperator(
                task_id=f"cleanup__{name}",
                table=name,
                cleanup_dry_run=cfg.maintenance.dry_run,
                log_retention_seconds=retention.total_seconds() if isinstance(retention, timedelta) else None,
                **conn_args(cfg),
            )
    return dag


def _task_dag_id() -> str | None:
    """The DAG a task process parses the file for (Airflow's parsing context), else ``None``."""
    from airflow.sdk import get_parsing_context

    return get_parsing_context().dag_id


def build_dags(config: MirrorConfig | None = None) -> dict[str, DAG]:
    """Every DAG of the config; in a task process, only its table's DAG when it is one.

    A task's start-up parses the DAG file for its own DAG (Airflow sets the parsing context); with a
    thousand tables, building every table's DAG there would cost seconds per task (docs/scaling.md).
    The scheduler's DAG processor has no parsing context and gets them all.
    """
    config = config or load_config()
    airflow_dag_settings.cache_clear()  # Airflow's config as it is at this parse
    wanted = _task_dag_id()
    for cfg in config.tables.values():
        if cfg.dag_id == wanted:  # its asset alone: the DAG processor refuses a config with a clash
            return {cfg.dag_id: table_dag(cfg)}
    assets = table_assets(config)  # two tables with one asset URI: refused before any DAG is built
    dags = [table_dag(cfg, assets[name]) for name, cfg in sorted(config.tables.items())]
    dags += [reconcile_dag(config), backfill_dag(config), monitor_dag(config), maintenance_dag(config)]
    dags += example_dags(config)
    return {dag.dag_id: dag for dag in dags}


__all__ = ["build_dags"]
