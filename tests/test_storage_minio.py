"""S3 end to end on MinIO, the S3 server the cluster and Compose run, through the same storage layer
as moto (``s3://``, put-if-absent as ``If-None-Match: *``).

moto stays the suite's everyday S3 server; this checks that a real one agrees: the published log
is complete, deltalake reads the rows, and of racing creates of one commit exactly one wins. One
MinIO per session (support/minio.py), a fresh bucket per test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cloud_store_kit import (
    VERSIONS,
    RawPut,
    assert_published_log,
    deltalake_rows,
    make_table,
    publish_with_cli,
    race_put_if_absent,
)
from support.minio import MinioServer, minio_session

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.storage import open_store, storage_options_for


@pytest.fixture(scope="session")
def minio() -> Iterator[MinioServer]:
    yield from minio_session()


@pytest.fixture
def bucket(minio: MinioServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; no ``AWS_*`` from the machine (or moto's ``s3_env``) leaks into the test."""
    for var in [v for v in os.environ if v.startswith("AWS_")]:
        monkeypatch.delenv(var)
    return minio.make_bucket()


def _raw_put(minio: MinioServer, bucket: str) -> RawPut:
    def put(path: str, data: bytes) -> None:
        minio.client().put_object(Bucket=bucket, Key=f"t/{path}", Body=data)

    return put


def test_publish_through_the_cli_then_deltalake_reads_it_from_minio(
    minio: MinioServer, bucket: str, tmp_path: Path
) -> None:
    location = f"s3://{bucket}/t"
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    _, ids = make_table(store_url, location, _raw_put(minio, bucket), tmp_path / "data")

    result = publish_with_cli(store_url, "t", minio.env())  # credentials from AWS_* only

    assert result["published"] == VERSIONS and result["checkpoints"] == [4], result
    assert_published_log(open_store(location, minio.env()))
    assert deltalake_rows(location, storage_options_for(location, minio.env())) == (VERSIONS - 1, ids)


def test_racing_creates_of_one_commit_on_minio_admit_exactly_one(minio: MinioServer, bucket: str) -> None:
    location = f"s3://{bucket}/t"
    race_put_if_absent(lambda: open_store(location, minio.env()), f"{LOG_DIR}/{commit_name(7)}")
