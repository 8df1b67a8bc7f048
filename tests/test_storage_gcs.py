"""Google Cloud Storage end to end on fake-gcs-server: ``gs://`` through the same storage layer.

Put-if-absent is the XML API's object PUT with ``x-goog-if-generation-match: 0`` (object_store's
``PutMode::Create``); GCS answers 412 when the object exists. fake-gcs-server 1.56 has no XML object
PUT, so uploads go through a small front that re-sends them as the JSON API's media upload with
``ifGenerationMatch`` (support/fake_gcs.py): the precondition is the emulator's own generation
check, but the header-to-parameter step is ours. Reads (deltalake included) go to the emulator
directly. A real deployment's check: ``test_put_if_absent_on_real_gcs`` below is what
to run against a real bucket.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import obstore
import pytest
from obstore.store import GCSStore
from support.cloud_store_kit import (
    NO_RETRY,
    VERSIONS,
    RawPut,
    assert_a_different_commit_halts,
    assert_full_reconcile_repairs,
    assert_identical_reput_is_idempotent,
    assert_published_log,
    assert_second_writer_refused,
    check_put_if_absent_on_a_real_bucket,
    deltalake_rows,
    make_table,
    publish_with_cli,
    race_put_if_absent,
)
from support.fake_gcs import FakeGcsServer, fake_gcs_session

from delta_mirror.airflow.storage_connections import storage_options_from_connection
from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.storage import open_store

REAL_GCS_ENV = "DELTA_MIRROR_TEST_GCS_LOCATION"


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[FakeGcsServer]:
    yield from fake_gcs_session()


@pytest.fixture
def bucket(fake_gcs: FakeGcsServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; no ``GOOGLE_*`` from the machine leaks into the test."""
    for var in [v for v in os.environ if v.startswith("GOOGLE_")]:
        monkeypatch.delenv(var)
    return fake_gcs.make_bucket()


def _raw_put(fake_gcs: FakeGcsServer, bucket: str) -> RawPut:
    key = fake_gcs.options()["GOOGLE_SERVICE_ACCOUNT_KEY"]
    raw = GCSStore(
        bucket, prefix="t", config={"service_account_key": key}, client_options={"allow_http": True}
    )

    def put(path: str, data: bytes) -> None:
        obstore.put(raw, path, data, use_multipart=False)

    return put


def _table(fake_gcs: FakeGcsServer, bucket: str, tmp_path: Path) -> tuple[Publisher, str]:
    location = f"gs://{bucket}/t"
    store, _ = make_table(
        f"sqlite:///{tmp_path / 'store.db'}", location, _raw_put(fake_gcs, bucket), tmp_path / "data"
    )
    return Publisher(store, retry=NO_RETRY, storage_options=fake_gcs.options()), location


def test_the_emulator_refuses_object_stores_xml_upload_so_the_front_is_needed(
    fake_gcs: FakeGcsServer, bucket: str
) -> None:
    """Why support/fake_gcs.py has a front: straight to fake-gcs-server, object_store's upload is a
    400 "invalid uploadType". When a release serves it, this fails: drop the front then."""
    direct = open_store(f"gs://{bucket}/t", fake_gcs.options(direct=True))
    with pytest.raises(Exception, match="invalid uploadType"):
        direct.put_if_absent(f"{LOG_DIR}/{commit_name(0)}", b"x\n")
    assert direct.get(f"{LOG_DIR}/{commit_name(0)}") is None


def test_the_emulators_generation_precondition_admits_one_of_racing_creates(
    fake_gcs: FakeGcsServer, bucket: str
) -> None:
    """The emulator's own check (JSON API, no front): ``ifGenerationMatch=0`` creates once, then 412."""
    assert fake_gcs.json_upload(bucket, "t/_delta_log/x.json", b"first", 0) == 200
    assert fake_gcs.json_upload(bucket, "t/_delta_log/x.json", b"second", 0) == 412
    assert open_store(f"gs://{bucket}/t", fake_gcs.options(direct=True)).get("_delta_log/x.json") == b"first"


def test_publish_through_the_cli_then_deltalake_reads_it(
    fake_gcs: FakeGcsServer, bucket: str, tmp_path: Path
) -> None:
    location = f"gs://{bucket}/t"
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    _, ids = make_table(store_url, location, _raw_put(fake_gcs, bucket), tmp_path / "data")

    result = publish_with_cli(store_url, "t", fake_gcs.options())  # credentials from GOOGLE_* only

    assert result["published"] == VERSIONS and result["checkpoints"] == [4], result
    assert_published_log(open_store(location, fake_gcs.options()))
    # deltalake reads from the emulator itself (no front)
    assert deltalake_rows(location, fake_gcs.options(direct=True)) == (VERSIONS - 1, ids)


def test_a_racing_second_writer_gets_already_exists_and_a_reput_is_idempotent(
    fake_gcs: FakeGcsServer, bucket: str, tmp_path: Path
) -> None:
    location = f"gs://{bucket}/t"
    race_put_if_absent(lambda: open_store(location, fake_gcs.options()), f"{LOG_DIR}/{commit_name(7)}")

    publisher, _ = _table(fake_gcs, bucket, tmp_path)
    assert publisher.publish("t").published == list(range(VERSIONS))
    assert_second_writer_refused(open_store(location, fake_gcs.options()), f"{LOG_DIR}/{commit_name(0)}")
    assert_identical_reput_is_idempotent(publisher.store, publisher)


def test_a_different_existing_commit_halts_the_table(
    fake_gcs: FakeGcsServer, bucket: str, tmp_path: Path
) -> None:
    publisher, location = _table(fake_gcs, bucket, tmp_path)
    assert_a_different_commit_halts(publisher.store, publisher, open_store(location, fake_gcs.options()))


def test_full_reconcile_lists_and_repairs(fake_gcs: FakeGcsServer, bucket: str, tmp_path: Path) -> None:
    publisher, location = _table(fake_gcs, bucket, tmp_path)
    publisher.publish("t")
    assert_full_reconcile_repairs(publisher.store, publisher, open_store(location, fake_gcs.options()))


def test_a_google_cloud_platform_connection_opens_the_store(fake_gcs: FakeGcsServer, bucket: str) -> None:
    """``keyfile_dict`` (the provider's extra) carries the emulator's key; its secret is masked."""
    keyfile = json.loads(fake_gcs.options()["GOOGLE_SERVICE_ACCOUNT_KEY"]) | {"private_key": "pk-secret"}

    class Gcp:
        conn_type, login, password, host = "google_cloud_platform", None, None, None
        extra_dejson = {"keyfile_dict": keyfile}  # noqa: RUF012 - a stand-in for Airflow's Connection

    masked: list[str | None] = []
    options = storage_options_from_connection(Gcp(), masked.append)
    assert "pk-secret" in masked
    objects = open_store(f"gs://{bucket}/t", {**options, "GOOGLE_ALLOW_HTTP": "true"})
    objects.put_if_absent(f"{LOG_DIR}/{commit_name(0)}", b"conn\n")
    assert objects.get(f"{LOG_DIR}/{commit_name(0)}") == b"conn\n"


@pytest.mark.skipif(
    not os.environ.get(REAL_GCS_ENV),
    reason=f"set {REAL_GCS_ENV}=gs://bucket/prefix (and GOOGLE_*) to run on real GCS",
)
def test_put_if_absent_on_real_gcs() -> None:
    """On a real bucket (not in CI): a second create of the same object is refused, the first kept."""
    check_put_if_absent_on_a_real_bucket(os.environ[REAL_GCS_ENV])
