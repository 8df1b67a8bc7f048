"""The operators: thin shells over the core, with one error translation and templated fields.

- a TRANSIENT failure becomes an ``AirflowException`` that Airflow retries (with the exponential
  backoff from the config); PERMANENT, CONFLICT and DATA become ``DeltaMirrorFailure``, an
  ``AirflowFailException``: no retry, and the message says what to do;
- checked both by calling ``execute()`` and by real runs: a storage endpoint that refuses
  connections (retried, then failed) and a foreign commit file at the table location (a conflict:
  failed at once, the table halted, an email naming both hashes);
- every operator's ``template_fields`` are rendered by Airflow's Jinja;
- every operator shares one base (``DeltaMirrorHookMixin``): its connection ids, their template
  fields and the hook built from them.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import pkgutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from dm_airflow_kit import MailBox, body_text, free_port, make_table, run_dag
from support.builders import EMPTY_SCHEMA_STRING, metadata_body, protocol_body

from delta_mirror.errors import (
    DataError,
    LeaseHeldError,
    PermanentError,
    PublishConflictError,
    TransientError,
)
from delta_mirror.store import SqlStore

FOREIGN = b'{"commitInfo":{"operation":"WRITE","engineInfo":"someone-else"}}\n'


@pytest.fixture
def table(sqlite_store: str, local_location: Path) -> SqlStore:
    store = SqlStore(sqlite_store)
    make_table(store, "t1", local_location.as_uri(), versions=3)
    return store


# --------------------------------------------------------------------------------------------------
# error translation, with the core stubbed


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (TransientError("S3 said 503 SlowDown", table="t1", hint="retried automatically"), True),
        (LeaseHeldError("another publisher holds this table's lease", table="t1"), True),
        (PermanentError("access denied", table="t1", hint="check the credentials"), False),
        (PublishConflictError("a different file already exists", table="t1", version=1), False),
        (DataError("version gap in the store", table="t1", version=2), False),
    ],
    ids=["transient", "lease-held", "permanent", "conflict", "data"],
)
def test_core_errors_become_retryable_or_failing_airflow_exceptions(
    sqlite_store: str, monkeypatch: pytest.MonkeyPatch, error: Exception, retried: bool
) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from delta_mirror.airflow.errors import DeltaMirrorFailure, DeltaMirrorTransientError
    from delta_mirror.airflow.operators import DeltaMirrorPublishOperator
    from delta_mirror.jobs.publisher import Publisher

    def fail(self: Publisher, name: str, to_version: int | None = None) -> None:
        raise error

    monkeypatch.setattr(Publisher, "publish", fail)
    op = DeltaMirrorPublishOperator(task_id="publish", table="t1")
    with pytest.raises(AirflowException) as exc:
        op.execute({})
    assert exc.value.__cause__ is error
    if retried:
        assert isinstance(exc.value, DeltaMirrorTransientError)
        assert not isinstance(exc.value, AirflowFailException)
        assert str(exc.value).startswith("[TRANSIENT] table 't1'")
    else:
        assert isinstance(exc.value, DeltaMirrorFailure) and isinstance(exc.value, AirflowFailException)
        assert str(exc.value).startswith(f"[{error.error_class.value}] table 't1'")  # type: ignore[attr-defined]
        assert "What to do" in str(exc.value) or "\n\n" in str(exc.value)


@pytest.mark.parametrize("strict", [False, "True"], ids=["lenient", "strict"])
def test_validate_logs_a_reader_limitation_and_fails_on_it_only_when_strict(
    table: SqlStore, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], strict: bool | str
) -> None:
    """The reader is stubbed to report a limitation (tests/jobs/test_reader_limits.py shows a real one)."""
    from airflow.sdk.exceptions import AirflowFailException

    from delta_mirror.airflow.operators import DeltaMirrorPublishOperator, DeltaMirrorValidateOperator
    from delta_mirror.jobs import validate
    from delta_mirror.jobs.validate.report import Limitation

    DeltaMirrorPublishOperator(task_id="publish", table="t1").execute({})
    real = validate.validate_table

    def with_a_limitation(*args: Any, **kwargs: Any) -> Any:
        report = real(*args, **kwargs)
        report.limitations.append(Limitation("deltalake", 1, "cannot read the prefixed DV", "spark"))
        return report

    monkeypatch.setattr(validate, "validate_table", with_a_limitation)
    op = DeltaMirrorValidateOperator(task_id="validate", table="t1", strict=strict)
    if strict:
        with pytest.raises(AirflowFailException, match=r"1 reader limitation\(s\) and no mirror problem"):
            op.execute({})
    else:
        assert op.execute({})["ok"] is True
    out = capfd.readouterr()
    assert "reader limitation [deltalake] version 1: cannot read the prefixed DV — read it with: spark" in (
        out.out + out.err
    )


def test_a_publish_conflict_raised_by_execute_names_both_hashes_and_halts_the_table(
    table: SqlStore, local_location: Path
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from delta_mirror.airflow.errors import DeltaMirrorFailure
    from delta_mirror.airflow.operators import DeltaMirrorPublishOperator

    (local_location / "_delta_log").mkdir()
    foreign = local_location / "_delta_log" / "00000000000000000001.json"
    foreign.write_bytes(FOREIGN)
    t1 = table.get_table("t1")
    expected = table.commit_rows(t1.id, 1, 1)[0].sha256

    with pytest.raises(AirflowFailException) as exc:
        DeltaMirrorPublishOperator(task_id="publish", table="t1").execute({})

    assert isinstance(exc.value, DeltaMirrorFailure)
    message = str(exc.value)
    assert message.startswith("[CONFLICT] table 't1', version 1:")
    assert expected in message and hashlib.sha256(FOREIGN).hexdigest() in message
    assert foreign.read_bytes() == FOREIGN  # never overwritten
    assert table.get_table("t1").state == "HALTED"
    assert (local_location / "_delta_log" / "00000000000000000000.json").exists()
    assert not (local_location / "_delta_log" / "00000000000000000002.json").exists()


def test_a_checkpoint_before_anything_is_published_fails_without_retry(table: SqlStore) -> None:
    from delta_mirror.airflow.errors import DeltaMirrorFailure
    from delta_mirror.airflow.operators import DeltaMirrorCheckpointOperator

    op = DeltaMirrorCheckpointOperator(task_id="checkpoint", table="t1", version="0", only_if_due=False)
    with pytest.raises(DeltaMirrorFailure, match=r"\[PERMANENT\] table 't1': nothing is published yet"):
        op.execute({})


@pytest.mark.parametrize(
    ("step", "engine", "lease"),
    [
        ("checkpoint", "local", 120.0),
        ("checkpoint", "auto", 3600.0),  # may start Spark in this worker
        ("checkpoint", "spark", 3600.0),  # a Spark build is not renewed: it must not lose the lease
        ("sync", "local", 120.0),
        ("sync", "auto", 3600.0),
        ("sync", "spark", 120.0),  # the spark-submit task after it checkpoints: this one only publishes
    ],
)
def test_a_step_that_may_build_with_spark_holds_the_long_lease(
    table: SqlStore,
    dm_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    engine: str,
    lease: float,
) -> None:
    """The lease each step's publisher asks for (refused here, so nothing is built and Spark never
    starts): the factory chooses it with the checkpoint builder (``spark.checkpoint_choice``)."""
    from airflow.sdk.exceptions import AirflowException

    from delta_mirror.airflow.operators import DeltaMirrorCheckpointOperator, DeltaMirrorSyncOperator
    from delta_mirror.jobs.publish_lease import LEASE_TTL_ENV
    from delta_mirror.jobs.publisher import Publisher

    monkeypatch.delenv(LEASE_TTL_ENV, raising=False)
    dm_config({"t1": {"checkpoint": {"engine": engine}}})
    Publisher(table).publish("t1", to_version=1)
    asked: list[float] = []

    def refuse(self: SqlStore, table_id: int, owner: str, ttl: float) -> bool:
        asked.append(ttl)
        return False  # another publisher holds it: the step stops before building anything

    monkeypatch.setattr(SqlStore, "acquire_lease", refuse)
    if step == "checkpoint":
        op: Any = DeltaMirrorCheckpointOperator(
            task_id="checkpoint", table="t1", version="1", only_if_due=False, engine=engine
        )
    else:
        op = DeltaMirrorSyncOperator(
            task_id="sync", table="t1", checkpoint_engine=engine, validate_every=None
        )
    with pytest.raises(AirflowException, match="another publisher holds this table's lease"):
        op.execute({})
    assert asked == [lease]


@pytest.mark.parametrize("bad", ["-1", "three", "1.5"])
def test_a_bad_version_from_a_template_fails_without_retry(table: SqlStore, bad: str) -> None:
    from delta_mirror.airflow.errors import DeltaMirrorFailure
    from delta_mirror.airflow.operators import DeltaMirrorPublishOperator

    with pytest.raises(DeltaMirrorFailure, match=r"\[DATA\] to_version"):
        DeltaMirrorPublishOperator(task_id="publish", table="t1", to_version=bad).execute({})


def test_a_step_switched_off_in_the_backfill_form_is_skipped(table: SqlStore) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from delta_mirror.airflow.operators import DeltaMirrorPublishOperator

    with pytest.raises(AirflowSkipException, match="not requested"):
        DeltaMirrorPublishOperator(task_id="publish", table="t1", enabled="False").execute({})
    assert table.last_published_version(table.get_table("t1").id) is None


# --------------------------------------------------------------------------------------------------
# real runs: Airflow retries transient failures and does not retry a conflict


@pytest.mark.usefixtures("airflow_db")
def test_a_storage_endpoint_that_refuses_connections_is_retried_by_airflow_with_backoff(
    dm_config: Callable[..., Path], sqlite_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqlStore(sqlite_store)
    store.create_table("t1", "s3://nowhere/t1")
    store.commit(
        "t1",
        [
            ("protocol", protocol_body()),
            (
                "metaData",
                metadata_body(
                    id="5b1c3c52-8d0e-4f0f-9a51-1d6f3f7c2a10",
                    schema_string=EMPTY_SCHEMA_STRING,
                    created_time=0,
                ),
            ),
        ],
    )
    closed = free_port()  # nothing listens there: every request is refused
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "key",
                "password": "secret",
                "extra": {"endpoint_url": f"http://127.0.0.1:{closed}", "region_name": "us-east-1"},
            }
        ),
    )
    dm_config(
        {"t1": {"aws_conn_id": "dm_s3", "retries": 1, "retry_delay": "1s"}}, retry_exponential_backoff=2.0
    )

    run = run_dag("delta_mirror__t1")

    publish = run.tasks["publish"]
    assert (publish.state, publish.try_number) == ("failed", 2)  # failed, retried, failed for good
    assert run.tasks["checkpoint"].state == "upstream_failed"
    (status,) = store.status_rows(store.get_table("t1").id, artifact="json")
    assert (status.state, status.error_class, status.attempts) == ("FAILED", "TRANSIENT", 2)
    assert f"127.0.0.1:{closed}" in (status.last_error or "")
    assert store.get_table("t1").state == "ACTIVE"  # a transient failure does not halt the table

    from airflow.dag_processing.dagbag import DagBag
    from dm_airflow_kit import DAGS_FOLDER

    task = DagBag(dag_folder=str(DAGS_FOLDER)).dags["delta_mirror__t1"].get_task("publish")
    assert (task.retries, task.retry_delay) == (1, timedelta(seconds=1))
    assert (task.retry_exponential_backoff, task.max_retry_delay) == (2.0, timedelta(minutes=10))


@pytest.mark.usefixtures("airflow_db")
def test_a_publish_conflict_fails_the_run_without_retry_and_emails_both_hashes(
    dm_config: Callable[..., Path], table: SqlStore, local_location: Path, mailbox: MailBox
) -> None:
    (local_location / "_delta_log").mkdir()
    foreign = local_location / "_delta_log" / "00000000000000000001.json"
    foreign.write_bytes(FOREIGN)
    expected = table.commit_rows(table.get_table("t1").id, 1, 1)[0].sha256
    dm_config({"t1": {"retries": 3, "notify": {"email": ["oncall@dm-tests.example"]}}})

    run = run_dag("delta_mirror__t1")

    publish = run.tasks["publish"]
    assert (publish.state, publish.try_number) == ("failed", 1)  # retries: 3, yet no retry
    assert foreign.read_bytes() == FOREIGN
    t1 = table.get_table("t1")
    assert t1.state == "HALTED" and t1.halted_version == 1
    states = {(r.version, r.state) for r in table.status_rows(t1.id, artifact="json")}
    assert {(0, "SUCCESS"), (1, "CONFLICT")} <= states

    msg = mailbox.wait_for(lambda m: "publish failed" in str(m["subject"]))
    assert msg is not None, mailbox.subjects()
    assert str(msg["subject"]) == "[delta-mirror] t1: task publish failed"
    assert msg["to"] == "oncall@dm-tests.example"
    body = body_text(msg)
    assert "[CONFLICT]" in body and expected in body and hashlib.sha256(FOREIGN).hexdigest() in body
    assert "delta-mirror resume" in body and "DAG: delta_mirror__t1" in body


# --------------------------------------------------------------------------------------------------
# template fields


def _render(op: Any, **params: Any) -> Any:
    op.render_template_fields({"params": params, "ds": "2026-01-02"})
    return op


def test_every_operator_renders_its_template_fields() -> None:
    """Spark's ingest operator too (its module imports no Spark until it runs)."""
    from airflow.sdk import DAG

    from delta_mirror.airflow import operators as ops
    from delta_mirror.airflow.operators.spark import DeltaMirrorSparkIngestOperator, as_dict, as_list

    with DAG("templates"):
        publish = ops.DeltaMirrorPublishOperator(
            task_id="publish",
            table="{{ params.table }}",
            to_version="{{ params.to }}",
            enabled="{{ 'publish' in params.steps }}",
            store_conn_id="{{ params.store }}",
            aws_conn_id="{{ params.aws }}",
        )
        checkpoint = ops.DeltaMirrorCheckpointOperator(
            task_id="checkpoint", table="{{ params.table }}", version="{{ params.to }}"
        )
        validate = ops.DeltaMirrorValidateOperator(
            task_id="validate",
            table="{{ params.table }}",
            from_version="{{ params.frm }}",
            to_version="{{ params.to }}",
            reader="{{ params.reader }}",
            strict="{{ params.strict }}",
            enabled="{{ 'validate' in params.steps }}",
        )
        reconcile = ops.DeltaMirrorReconcileOperator(
            task_id="reconcile", tables=["{{ params.table }}", "other"], strategy="{{ params.strategy }}"
        )
        lag = ops.DeltaMirrorLagOperator(task_id="lag", tables=["{{ params.table }}"])
        maintenance = ops.DeltaMirrorMaintenanceOperator(
            task_id="cleanup", table="{{ params.table }}", cleanup_dry_run="{{ params.dry }}"
        )
        ingest = DeltaMirrorSparkIngestOperator(
            task_id="ingest",
            table="{{ params.table }}",
            source="{{ params.source }}",
            source_format="{{ params.format }}",
            location="{{ params.location }}",
            partition_by="{{ params.partition_by | join(',') }}",
            mode="{{ params.mode }}",
            schema="{{ params.schema }}",
            options="{{ params.options }}",
        )
    params = {
        "table": "sales",
        "to": 7,
        "frm": 2,
        "steps": ["publish"],
        "store": "pg",
        "aws": "s3",
        "reader": "deltalake",
        "strict": True,
        "strategy": "incremental",
        "dry": False,
        "source": "/in/*.csv",
        "format": "json",
        "location": "/lake/events",
        "partition_by": ["country", "day"],
        "mode": "overwrite",
        "schema": None,
        "options": {"multiLine": "true"},
    }
    for op in (publish, checkpoint, validate, reconcile, lag, maintenance, ingest):
        _render(op, **params)

    assert (publish.table, publish.to_version, publish.enabled) == ("sales", "7", "True")
    assert (publish.store_conn_id, publish.aws_conn_id) == ("pg", "s3")
    assert (publish.hook.store_conn_id, publish.hook.aws_conn_id) == ("pg", "s3")
    assert (checkpoint.table, checkpoint.version) == ("sales", "7")
    assert (validate.from_version, validate.to_version, validate.reader, validate.enabled) == (
        "2",
        "7",
        "deltalake",
        "False",
    )
    assert validate.strict == "True"
    assert (reconcile.tables, reconcile.strategy) == (["sales", "other"], "incremental")
    assert lag.tables == ["sales"]
    assert (maintenance.table, maintenance.cleanup_dry_run) == ("sales", "False")
    assert (ingest.table, ingest.source, ingest.source_format, ingest.location, ingest.mode) == (
        "sales",
        "/in/*.csv",
        "json",
        "/lake/events",
        "overwrite",
    )
    assert as_list(ingest.partition_by) == ["country", "day"] and ingest.schema == "None"
    assert as_dict(ingest.options) == {"multiLine": "true"}
    assert as_list("") is None and as_list("['a']") == ["a"] and as_dict("") == {}
    expected: dict[ops.DeltaMirrorBaseOperator, set[str]] = {
        publish: {"table", "enabled", "store_conn_id", "aws_conn_id", "to_version"},
        checkpoint: {"table", "enabled", "store_conn_id", "aws_conn_id", "version"},
        validate: {
            "table",
            "enabled",
            "store_conn_id",
            "aws_conn_id",
            "from_version",
            "to_version",
            "reader",
            "strict",
        },
        reconcile: {"store_conn_id", "aws_conn_id", "tables", "strategy"},
        lag: {"store_conn_id", "aws_conn_id", "tables"},
        maintenance: {"table", "enabled", "store_conn_id", "aws_conn_id", "cleanup_dry_run"},
        ingest: {
            "table",
            "enabled",
            "store_conn_id",
            "aws_conn_id",
            "source",
            "source_format",
            "location",
            "partition_by",
            "mode",
            "schema",
            "options",
        },
    }
    for operator, fields in expected.items():
        assert set(operator.template_fields) == fields, operator.task_id


def test_unset_templated_connection_ids_mean_the_defaults() -> None:
    from airflow.sdk import DAG

    from delta_mirror.airflow.operators import DeltaMirrorPublishOperator

    with DAG("templates"):
        op = DeltaMirrorPublishOperator(
            task_id="publish",
            table="t",
            store_conn_id="{{ {'a': 'pg'}.get(params.table, '') }}",
            aws_conn_id="{{ params.aws }}",
        )
    _render(op, table="t", aws=None)
    assert (op.store_conn_id, op.aws_conn_id) == ("", "None")
    assert (op.hook.store_conn_id, op.hook.aws_conn_id) == (None, None)


# --------------------------------------------------------------------------------------------------
# one base for every operator


def _operator_classes() -> dict[str, type]:
    """Every operator class defined in ``delta_mirror.airflow``, by name."""
    from airflow.sdk import BaseOperator

    import delta_mirror.airflow

    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(delta_mirror.airflow.__path__, "delta_mirror.airflow."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                isinstance(obj, type)
                and issubclass(obj, BaseOperator)
                and obj.__module__.startswith("delta_mirror.airflow")
            ):
                found[name] = obj
    return found


def test_every_operator_is_exported_and_derives_from_the_shared_base() -> None:
    import delta_mirror.airflow
    from delta_mirror.airflow.mixins import DeltaMirrorHookMixin

    defined = _operator_classes()
    assert "DeltaMirrorSparkCheckpointOperator" in defined and "DeltaMirrorPublishOperator" in defined
    exported = {n: getattr(delta_mirror.airflow, n) for n in delta_mirror.airflow.__all__}
    assert {n: c for n, c in exported.items() if n in defined} == defined, "an operator is not exported"
    shared_hook = inspect.getattr_static(DeltaMirrorHookMixin, "hook")
    for name, cls in defined.items():
        assert issubclass(cls, DeltaMirrorHookMixin), f"{name} does not derive from DeltaMirrorHookMixin"
        assert inspect.getattr_static(cls, "hook") is shared_hook, f"{name} builds its own hook"


def test_every_operator_declares_the_shared_template_fields_once_and_each_is_an_argument() -> None:
    from delta_mirror.airflow.mixins import CONNECTION_FIELDS
    from delta_mirror.airflow.operators import DeltaMirrorTableOperator

    for name, cls in _operator_classes().items():
        fields = list(cls.template_fields)  # type: ignore[attr-defined]
        assert len(fields) == len(set(fields)), f"{name} declares a template field twice"
        assert set(CONNECTION_FIELDS) <= set(fields), f"{name} does not template its connection ids"
        if issubclass(cls, DeltaMirrorTableOperator):
            assert set(DeltaMirrorTableOperator.template_fields) <= set(fields), name
        arguments = {
            p
            for c in cls.__mro__
            if "__init__" in vars(c)
            for p in inspect.signature(vars(c)["__init__"]).parameters
        }
        assert set(fields) <= arguments, f"{name} templates a field that is no constructor argument"


def test_every_operator_hook_and_trigger_documents_each_constructor_argument_with_a_param_line() -> None:
    """Airflow's convention (``:param name: ...``), read by its docs and IDEs: an argument is
    documented on the class that takes it, or on a delta-mirror base class that does."""
    from delta_mirror.airflow.hooks import DeltaMirrorHook
    from delta_mirror.airflow.triggers import StoreCommitTrigger

    classes: dict[str, type] = {
        **_operator_classes(),
        "DeltaMirrorHook": DeltaMirrorHook,
        "StoreCommitTrigger": StoreCommitTrigger,
    }
    for name, cls in classes.items():
        ours = [c for c in cls.__mro__ if c.__module__.startswith("delta_mirror.")]
        documented = "\n".join(inspect.getdoc(c) or "" for c in ours)
        for c in ours:
            if "__init__" not in vars(c):
                continue
            for p in inspect.signature(vars(c)["__init__"]).parameters.values():
                if p.name != "self" and p.kind is not p.VAR_KEYWORD:
                    assert f":param {p.name}:" in documented, f"{name}: no ':param {p.name}:' line"


_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("idempotent", "context", "txn"),
    [
        (True, {"dag_run": SimpleNamespace(run_after=_AT)}, ("airflow:d.t", 1767323045000)),
        (
            True,
            {"dag_run": SimpleNamespace(run_after=None), "logical_date": _AT},
            ("airflow:d.t", 1767323045000),
        ),
        (True, {}, (None, None)),  # no run time: nothing to key a retry on
        (False, {"dag_run": SimpleNamespace(run_after=_AT)}, (None, None)),
    ],
    ids=["run-after", "logical-date", "no-time", "not-idempotent"],
)
def test_an_idempotent_spark_step_keys_its_commit_on_the_dag_task_and_run_time(
    idempotent: bool, context: dict[str, Any], txn: tuple[str | None, int | None]
) -> None:
    """Shared by the ingest and pipeline operators: a retried run carries the same txn, so Delta skips it."""
    from delta_mirror.airflow.operators.spark import run_txn

    op = SimpleNamespace(idempotent=idempotent, dag_id="d", task_id="t")
    assert run_txn(op, context) == txn
