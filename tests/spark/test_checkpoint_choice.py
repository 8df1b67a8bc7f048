"""The checkpoint engine's choice (``spark.checkpoint_choice``): one factory gives every caller the
builder and the lease together.

- ``local`` builds in process under the usual lease; ``spark`` and ``auto`` get a builder that
  starts Spark only when a checkpoint is built, and the long lease (a Spark build is not renewed);
- the engine named by the caller (``--engine``, an operator's argument) beats the table config's;
- ``auto`` below its threshold builds locally and never starts Spark.

No SparkSession is started here: what is checked is the choice, not the Spark build
(``test_checkpoint_engine.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.builders import add_body

from delta_mirror.dev.datafiles import create_table_actions
from delta_mirror.errors import PermanentError
from delta_mirror.jobs.publish_lease import DEFAULT_LEASE_TTL, LEASE_TTL_ENV, SPARK_LEASE_TTL
from delta_mirror.spark.checkpoint_choice import (
    ConfiguredBuilder,
    choose_engine,
    engines_used,
    last_engine,
    publisher_for,
)
from delta_mirror.store import SqlStore
from delta_mirror.table_config import CheckpointEngine, CheckpointSettings


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SqlStore:
    monkeypatch.delenv(LEASE_TTL_ENV, raising=False)
    store = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.init()
    return store


@pytest.mark.parametrize(
    ("engine", "active_files", "threshold", "chosen"),
    [
        ("local", 10**9, 5, "local"),  # local stays local however big
        ("spark", 0, 5, "spark"),  # spark stays spark however small
        ("auto", 4, 5, "local"),
        ("auto", 5, 5, "spark"),  # from the threshold on
        ("auto", None, 5, "local"),  # nothing published: nothing to count
        (CheckpointEngine.AUTO, 6, 5, "spark"),  # a member as well as its name
    ],
)
def test_choose_engine_turns_auto_into_spark_from_the_threshold_on(
    engine: str, active_files: int | None, threshold: int, chosen: str
) -> None:
    assert choose_engine(engine, active_files, threshold) == chosen


@pytest.mark.parametrize(
    ("engine", "configured", "builder_engine", "lease"),
    [
        (None, None, None, DEFAULT_LEASE_TTL),  # no config: local
        (None, "local", None, DEFAULT_LEASE_TTL),
        (None, "spark", "spark", SPARK_LEASE_TTL),  # the table config decides
        (None, "auto", "auto", SPARK_LEASE_TTL),  # auto may start Spark: the long lease too
        ("local", "spark", None, DEFAULT_LEASE_TTL),  # the caller's engine beats the config's
        ("spark", "local", "spark", SPARK_LEASE_TTL),
        ("auto", None, "auto", SPARK_LEASE_TTL),
    ],
)
def test_publisher_for_chooses_the_builder_and_the_lease_together(
    store: SqlStore, engine: str | None, configured: str | None, builder_engine: str | None, lease: float
) -> None:
    settings = CheckpointSettings(engine=CheckpointEngine(configured)) if configured else None
    publisher = publisher_for(store, "t", engine, settings=settings)
    assert publisher.lease_ttl == lease
    if builder_engine is None:
        assert publisher.checkpoint_builder is None  # the publisher's in-process engine
    else:
        builder = publisher.checkpoint_builder
        assert isinstance(builder, ConfiguredBuilder)
        assert (builder.name, builder.engine, builder.used) == ("t", builder_engine, [])  # Spark not started


def test_publisher_for_passes_the_publishers_other_arguments_on(store: SqlStore) -> None:
    publisher = publisher_for(
        store, "t", "spark", storage_options={"AWS_REGION": "eu-west-1"}, cadence_checkpoints=False
    )
    assert publisher.storage_options == {"AWS_REGION": "eu-west-1"}
    assert publisher.cadence_checkpoints is False
    assert publisher.lease_ttl == SPARK_LEASE_TTL


def test_an_unknown_engine_is_refused_naming_the_three(store: SqlStore) -> None:
    with pytest.raises(PermanentError, match="unknown checkpoint engine 'fast'") as exc:
        publisher_for(store, "t", "fast")
    assert exc.value.hint == "use local, spark or auto"


def test_auto_below_its_threshold_builds_in_process_without_starting_spark(
    store: SqlStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_spark(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Spark was started for a table below the threshold")

    monkeypatch.setattr("delta_mirror.spark.session.get_spark", no_spark)
    location = tmp_path / "t"
    location.mkdir()
    store.create_table("t", location.as_uri())
    store.commit("t", [*create_table_actions(pa.schema([("id", pa.int64())]))])
    store.commit("t", [("add", add_body("part-1.parquet"))])
    settings = CheckpointSettings(engine=CheckpointEngine.AUTO, spark_threshold_files=1000)
    publisher = publisher_for(store, "t", settings=settings)
    publisher.publish("t")
    assert publisher.checkpoint("t") == 1
    assert engines_used(publisher) == [CheckpointEngine.LOCAL]  # 1 active file < 1000
    assert last_engine(publisher) == "local"
    assert (location / "_delta_log" / "00000000000000000001.checkpoint.parquet").is_file()


def test_a_local_publisher_reports_the_local_engine(store: SqlStore) -> None:
    publisher = publisher_for(store, "t", "local")
    assert engines_used(publisher) == []  # no configured builder records anything
    assert last_engine(publisher) is CheckpointEngine.LOCAL


@pytest.mark.parametrize(
    ("command", "engine", "lease"),
    [
        ("checkpoint", "local", DEFAULT_LEASE_TTL),
        ("checkpoint", "spark", SPARK_LEASE_TTL),
        ("checkpoint", "auto", SPARK_LEASE_TTL),
        ("mirror", "local", DEFAULT_LEASE_TTL),
        ("mirror", "spark", SPARK_LEASE_TTL),  # its cadence checkpoints may be built by Spark
        ("sync", "local", DEFAULT_LEASE_TTL),
        ("sync", "auto", SPARK_LEASE_TTL),
    ],
)
def test_each_cli_command_takes_the_lease_its_engine_needs(
    store: SqlStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    engine: str,
    lease: float,
) -> None:
    """The lease each command asks for with ``--engine`` (refused, so nothing is built and Spark never
    starts): transient, exit 5, as any held lease."""
    from click.testing import CliRunner

    from delta_mirror.cli import cli
    from delta_mirror.jobs.publisher import Publisher

    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(tmp_path / "absent.yaml"))
    location = tmp_path / "t"
    location.mkdir()
    store.create_table("t", location.as_uri())
    store.commit("t", [*create_table_actions(pa.schema([("id", pa.int64())]))])
    Publisher(store).publish("t")
    store.commit("t", [("add", add_body("part-1.parquet"))])  # one version for mirror and sync to publish
    asked: list[float] = []

    def refuse(self: SqlStore, table_id: int, owner: str, ttl: float) -> bool:
        asked.append(ttl)
        return False

    monkeypatch.setattr(SqlStore, "acquire_lease", refuse)
    result = CliRunner().invoke(cli, ["--store", store.url, command, "t", "--engine", engine])
    assert result.exit_code == 5, result.output
    assert asked == [lease]
