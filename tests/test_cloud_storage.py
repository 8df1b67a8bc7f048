"""Every object store the mirror publishes to, end to end on a real server: Azure Blob on Azurite
(``az://``, ``abfss://``), GCS on fake-gcs-server (``gs://``) and S3 on MinIO (``s3://``, the
server the cluster and Compose run; moto stays the suite's everyday S3 server).

One suite, parametrized over the three: each publishes a table through the CLI and deltalake reads
the rows, of racing creates of one commit exactly one wins, a re-put of the same bytes is
idempotent, a different existing commit halts the table, and a full reconcile repairs a lost
commit and checkpoint. Put-if-absent is object_store's ``PutMode::Create`` on each: Put Blob with
``If-None-Match: *`` (409 BlobAlreadyExists), the XML object PUT with
``x-goog-if-generation-match: 0`` (412), and S3's ``If-None-Match: *`` (412).

fake-gcs-server 1.56 has no XML object PUT, so its uploads go through a small front that re-sends
them as the JSON API's media upload with ``ifGenerationMatch`` (support/fake_gcs.py): the
precondition is the emulator's own generation check, the header-to-parameter step is ours, and
deltalake reads from the emulator directly. The checks only one store has (the Azure emulator
switch and key errors, the GCS front) follow the suite. Each emulator starts once per session
(support/emulator.py), lazily, with a fresh container or bucket per test; a missing one skips its
tests, or fails them under ``CI=true``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import obstore
import pytest
from obstore.store import AzureStore, GCSStore
from support.azurite import ACCOUNT, ACCOUNT_KEY, AzuriteServer, azurite_session
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
from support.minio import MinioServer, minio_session

from delta_mirror.airflow.storage_connections import storage_options_from_connection
from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.errors import PermanentError
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.storage import ObjectExistsError, ObjectStore, open_store, storage_options_for
from delta_mirror.store import SqlStore

# --------------------------------------------------------------------------------------------------
# the emulators (one each per session) and one fresh container or bucket per test


@pytest.fixture(scope="session")
def azurite() -> Iterator[AzuriteServer]:
    yield from azurite_session()


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[FakeGcsServer]:
    yield from fake_gcs_session()


@pytest.fixture(scope="session")
def minio() -> Iterator[MinioServer]:
    yield from minio_session()


@dataclass(frozen=True)
class Cloud:
    """One object store under test, with a fresh container or bucket ``bucket``."""

    name: str
    location: str  # "<scheme>://<bucket>/t"
    options: dict[str, str]  # the mirror's storage options, also its environment for the CLI
    raw_put: RawPut  # uploads a data file (outside _delta_log/) straight to the server
    deltalake_reads: list[tuple[str, dict[str, str]]]  # (URL, storage options) deltalake reads by
    other_form: str  # another URL of the same objects (Azure's Hadoop form), else ``location``

    def objects(self) -> ObjectStore:
        return open_store(self.location, self.options)

    def table(self, tmp_path: Path, location: str | None = None) -> tuple[SqlStore, Publisher]:
        """Table ``t`` of :data:`VERSIONS` versions at ``location`` and a publisher with no retry."""
        store, _ = make_table(
            f"sqlite:///{tmp_path / 'store.db'}", location or self.location, self.raw_put, tmp_path / "data"
        )
        return store, Publisher(store, retry=NO_RETRY, storage_options=self.options)


def _clean_env(monkeypatch: pytest.MonkeyPatch, *prefixes: str) -> None:
    """No credentials from the machine (or moto's ``s3_env``) leak into the test."""
    for var in [v for v in os.environ if v.startswith(prefixes)]:
        monkeypatch.delenv(var)


def _obstore_put(raw: AzureStore | GCSStore) -> RawPut:
    def put(path: str, data: bytes) -> None:
        obstore.put(raw, path, data, use_multipart=False)

    return put


def _azure(request: pytest.FixtureRequest) -> Cloud:
    azurite: AzuriteServer = request.getfixturevalue("azurite")
    container = azurite.make_container()
    location, options = f"az://{container}/t", azurite.options()
    raw = AzureStore(
        container,
        prefix="t",
        config={"account_name": ACCOUNT, "account_key": ACCOUNT_KEY, "endpoint": azurite.endpoint},
        client_options={"allow_http": True},
    )
    abfss = f"abfss://{container}@{ACCOUNT}.dfs.core.windows.net/t"  # the Hadoop form, same blobs
    # deltalake reads through object_store's Azure client, by either URL form
    reads = [(location, storage_options_for(location, options)), (abfss, options)]
    return Cloud("azure", location, options, _obstore_put(raw), reads, abfss)


def _gcs(request: pytest.FixtureRequest) -> Cloud:
    fake_gcs: FakeGcsServer = request.getfixturevalue("fake_gcs")
    bucket = fake_gcs.make_bucket()
    location, options = f"gs://{bucket}/t", fake_gcs.options()
    key = options["GOOGLE_SERVICE_ACCOUNT_KEY"]
    raw = GCSStore(
        bucket, prefix="t", config={"service_account_key": key}, client_options={"allow_http": True}
    )
    # deltalake reads from the emulator itself (no front)
    reads = [(location, fake_gcs.options(direct=True))]
    return Cloud("gcs", location, options, _obstore_put(raw), reads, location)


def _minio(request: pytest.FixtureRequest) -> Cloud:
    minio: MinioServer = request.getfixturevalue("minio")
    bucket = minio.make_bucket()
    location, options = f"s3://{bucket}/t", minio.env()

    def put(path: str, data: bytes) -> None:
        minio.client().put_object(Bucket=bucket, Key=f"t/{path}", Body=data)

    return Cloud(
        "minio", location, options, put, [(location, storage_options_for(location, options))], location
    )


CLOUDS: dict[str, tuple[Callable[[pytest.FixtureRequest], Cloud], tuple[str, ...]]] = {
    "azure": (_azure, ("AZURE_", "AZURITE_")),
    "gcs": (_gcs, ("GOOGLE_",)),
    "minio": (_minio, ("AWS_",)),
}


@pytest.fixture(params=sorted(CLOUDS))
def cloud(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    """Each store in turn, on a fresh container or bucket, with the machine's credentials gone."""
    make, env_prefixes = CLOUDS[request.param]
    _clean_env(monkeypatch, *env_prefixes)
    return make(request)


# --------------------------------------------------------------------------------------------------
# the suite every store passes


def test_publish_through_the_cli_then_deltalake_reads_it(cloud: Cloud, tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    _, ids = make_table(store_url, cloud.location, cloud.raw_put, tmp_path / "data")

    result = publish_with_cli(store_url, "t", cloud.options)  # credentials from the environment only

    assert result["published"] == VERSIONS and result["checkpoints"] == [4], result
    assert_published_log(cloud.objects())
    for url, options in cloud.deltalake_reads:
        assert deltalake_rows(url, options) == (VERSIONS - 1, ids), url


def test_a_racing_second_writer_gets_already_exists_and_a_reput_is_idempotent(
    cloud: Cloud, tmp_path: Path
) -> None:
    race_put_if_absent(cloud.objects, f"{LOG_DIR}/{commit_name(7)}")

    store, publisher = cloud.table(tmp_path)
    assert publisher.publish("t").published == list(range(VERSIONS))
    assert_second_writer_refused(cloud.objects(), f"{LOG_DIR}/{commit_name(0)}")
    assert_identical_reput_is_idempotent(store, publisher)


def test_a_different_existing_commit_halts_the_table(cloud: Cloud, tmp_path: Path) -> None:
    store, publisher = cloud.table(tmp_path, cloud.other_form)
    assert_a_different_commit_halts(store, publisher, cloud.objects())


def test_full_reconcile_lists_and_repairs(cloud: Cloud, tmp_path: Path) -> None:
    store, publisher = cloud.table(tmp_path)
    publisher.publish("t")
    assert_full_reconcile_repairs(store, publisher, cloud.objects())


REAL_BUCKETS = {
    "DELTA_MIRROR_TEST_AZURE_LOCATION": "az://container/prefix (and AZURE_STORAGE_*) to run on real Azure",
    "DELTA_MIRROR_TEST_GCS_LOCATION": "gs://bucket/prefix (and GOOGLE_*) to run on real GCS",
}


@pytest.mark.parametrize(
    "env_var",
    [
        pytest.param(var, id=f"real_{var.split('_')[3].lower()}", marks=pytest.mark.skipif(
            not os.environ.get(var), reason=f"set {var}={how}"
        ))
        for var, how in REAL_BUCKETS.items()
    ],
)  # fmt: skip
def test_put_if_absent_on_a_real_bucket(env_var: str) -> None:
    """On a real account or bucket (not in CI): a second create of one object is refused, the first kept."""
    check_put_if_absent_on_a_real_bucket(os.environ[env_var])


# --------------------------------------------------------------------------------------------------
# Azure only: the emulator switch, an Airflow wasb connection, refusals


@pytest.fixture
def container(azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch) -> str:
    _clean_env(monkeypatch, *CLOUDS["azure"][1])
    return azurite.make_container()


def test_the_emulator_switch_and_an_airflow_wasb_connection_open_the_same_store(
    azurite: AzuriteServer, container: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AZURE_STORAGE_USE_EMULATOR`` (Azurite's well-known account at ``AZURITE_BLOB_STORAGE_URL``)
    and a ``wasb`` connection (login = account, password = key, host = endpoint) both work."""
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", azurite.endpoint.removesuffix(f"/{ACCOUNT}"))
    by_env = open_store(f"az://{container}/t")
    by_env.put_if_absent(f"{LOG_DIR}/{commit_name(0)}", b"env\n")
    monkeypatch.delenv("AZURE_STORAGE_USE_EMULATOR")

    class Wasb:
        conn_type, login, password, host = "wasb", ACCOUNT, ACCOUNT_KEY, azurite.endpoint
        extra_dejson: dict[str, object] = {}  # noqa: RUF012 - a stand-in for Airflow's Connection

    masked: list[str | None] = []
    options = storage_options_from_connection(Wasb(), masked.append)
    assert options == azurite.options() and ACCOUNT_KEY in masked
    by_connection = open_store(f"az://{container}/t", options)
    assert by_connection.get(f"{LOG_DIR}/{commit_name(0)}") == b"env\n"
    with pytest.raises(ObjectExistsError):
        by_connection.put_if_absent(f"{LOG_DIR}/{commit_name(0)}", b"connection\n")


def test_a_wrong_key_or_a_missing_container_is_permanent_with_a_hint(
    azurite: AzuriteServer, container: str
) -> None:
    wrong = {**azurite.options(), "AZURE_STORAGE_ACCOUNT_KEY": ACCOUNT_KEY[:-4] + "AAA="}
    with pytest.raises(PermanentError, match="access denied") as denied:
        open_store(f"az://{container}/t", wrong).put_if_absent(f"{LOG_DIR}/{commit_name(0)}", b"x\n")
    assert "AZURE_STORAGE_" in (denied.value.hint or "")
    with pytest.raises(PermanentError, match=r"bucket missing|not found"):
        open_store("az://no-such-container/t", azurite.options()).put_if_absent(
            f"{LOG_DIR}/{commit_name(0)}", b"x\n"
        )


# --------------------------------------------------------------------------------------------------
# GCS only: why the front exists, the emulator's own precondition, an Airflow GCP connection


@pytest.fixture
def bucket(fake_gcs: FakeGcsServer, monkeypatch: pytest.MonkeyPatch) -> str:
    _clean_env(monkeypatch, *CLOUDS["gcs"][1])
    return fake_gcs.make_bucket()


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
