"""``validate --reader spark`` on a table published to S3 (the moto server), read through s3a.

The table's storage options (endpoint, keys, region, plain HTTP) become per-bucket s3a settings of
the one shared session; the secret key must never show in a report, an error or the output.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.builders import EVENTS_SCHEMA, event_add, remove_of

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.dev.datafiles import create_table_actions
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import validate_table
from delta_mirror.spark.s3a import redact, s3a_settings
from delta_mirror.store.sql_store import SqlStore

NAME = "s3events"
SECRET = f"dm-secret-{uuid.uuid4().hex}"  # moto accepts any key; this one must never be printed


def _publish_to_s3(s3: Any, tmp: Path) -> tuple[SqlStore, str, dict[str, str]]:
    """Versions 0..4 (a checkpoint at 3) committed through the store and published to a fresh bucket."""
    bucket = s3.make_bucket()
    options = {**s3.env(), "AWS_SECRET_ACCESS_KEY": SECRET}
    options.pop("AWS_DEFAULT_REGION")
    data_root = tmp / "data"
    store = SqlStore(f"sqlite:///{tmp / 'store.db'}")
    store.init()
    store.create_table(NAME, f"s3://{bucket}/table")
    first = event_add(data_root, [1, 2], "a b")
    create = create_table_actions(
        EVENTS_SCHEMA, partition_columns=["country"], configuration={"delta.checkpointInterval": "3"}
    )
    store.commit(NAME, [*create, first, event_add(data_root, [3], "ü%")])
    store.commit(NAME, [event_add(data_root, [4, 5], "fr")])
    store.commit(NAME, [remove_of(first)])
    store.commit(NAME, [event_add(data_root, [6], "fr")])
    store.commit(NAME, [event_add(data_root, [7, 8], "de")])
    client = s3.client()
    for item in data_root.rglob("*"):  # the data files go where the log says (keys are decoded paths)
        if item.is_file():
            client.upload_file(str(item), bucket, f"table/{item.relative_to(data_root).as_posix()}")
    publisher = Publisher(store, storage_options=options)
    publisher.publish(NAME, to_version=3)  # the cadence checkpoints version 3
    publisher.publish(NAME)
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="table/_delta_log/")["Contents"]}
    assert f"table/{LOG_DIR}/00000000000000000003.checkpoint.parquet" in keys
    return store, bucket, options


def test_s3_options_become_per_bucket_s3a_settings() -> None:
    settings = s3a_settings(
        "lake",
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
            "AWS_ACCESS_KEY_ID": "AKID",
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "eu-west-1",
            "AWS_ALLOW_HTTP": "true",
            "timeout": "2s",  # an object_store option s3a has no use for
        },
    )
    assert settings == {
        "fs.s3a.bucket.lake.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.bucket.lake.path.style.access": "true",
        "fs.s3a.bucket.lake.connection.ssl.enabled": "false",
        "fs.s3a.bucket.lake.endpoint.region": "eu-west-1",
        "fs.s3a.bucket.lake.access.key": "AKID",
        "fs.s3a.bucket.lake.secret.key": SECRET,
        "fs.s3a.bucket.lake.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    }
    with_token = s3a_settings(
        "lake", {"aws_access_key_id": "A", "aws_secret_access_key": "S", "aws_session_token": "T"}
    )
    assert with_token["fs.s3a.bucket.lake.session.token"] == "T"
    assert with_token["fs.s3a.bucket.lake.aws.credentials.provider"].endswith(
        "TemporaryAWSCredentialsProvider"
    )
    assert s3a_settings("lake", {"AWS_REGION": "us-east-1"}) == {
        "fs.s3a.bucket.lake.endpoint.region": "us-east-1"
    }
    assert redact(f"denied for key {SECRET}!", {"AWS_SECRET_ACCESS_KEY": SECRET}) == "denied for key ***!"


def test_spark_validates_a_table_on_s3(
    spark: Any, s3: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the options passed in (as the Airflow operator does from its AWS connection) and no AWS_* env."""
    store, bucket, options = _publish_to_s3(s3, tmp_path)
    for var in (
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
        "AWS_ALLOW_HTTP",
    ):
        monkeypatch.delenv(var, raising=False)
    report = validate_table(store, NAME, reader="spark", spark=spark, storage_options=options)
    assert report.ok, [f"{p.kind} v{p.version}: {p.message}" for p in report.problems]
    assert report.versions_checked == 5
    df = spark.read.format("delta").load(f"s3a://{bucket}/table")  # latest: our checkpoint at 3 + 4.json
    assert sorted(r["id"] for r in df.collect()) == [3, 4, 5, 6, 7, 8]
    assert SECRET not in capfd.readouterr().err


def test_cli_validate_with_the_spark_reader_on_s3(
    spark: Any, s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI takes the credentials from the AWS_* environment (a fresh bucket: Hadoop caches one
    file system per bucket, so settings from another test cannot stand in for the environment's)."""
    from click.testing import CliRunner

    from delta_mirror.cli import cli

    store, _, options = _publish_to_s3(s3, tmp_path)
    for key, value in options.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(cli, ["--store", store.url, "validate", NAME, "--reader", "spark", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{") :])
    assert report["ok"] and report["versions_checked"] == 5
    assert SECRET not in result.output


def test_spark_reader_on_s3_reports_a_tampered_and_a_missing_commit(
    spark: Any, s3: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    store, bucket, options = _publish_to_s3(s3, tmp_path)
    client = s3.client()
    key = f"table/{LOG_DIR}/{commit_name(1)}"
    lines = client.get_object(Bucket=bucket, Key=key)["Body"].read().decode().splitlines(keepends=True)
    client.put_object(
        Bucket=bucket, Key=key, Body="".join(x for x in lines if not x.startswith('{"add"')).encode()
    )
    client.delete_object(Bucket=bucket, Key=f"table/{LOG_DIR}/{commit_name(2)}")

    report = validate_table(store, NAME, to_version=2, reader="spark", spark=spark, storage_options=options)

    kinds = {(p.kind, p.version) for p in report.problems}
    assert {("hash_mismatch", 1), ("missing_commit", 2)} <= kinds, report.problems
    assert ("reader_files", 1) in kinds, report.problems  # Spark lost the dropped add
    assert any(p.kind in ("reader_error", "reader_version") and p.version == 2 for p in report.problems)
    text = json.dumps(report.to_json())
    assert SECRET not in text and SECRET not in capfd.readouterr().err
