"""Azure Blob Storage end to end on Azurite: ``az://`` and ``abfss://`` through the same storage layer.

Put-if-absent is Put Blob with ``If-None-Match: *`` (object_store's ``PutMode::Create``); Azurite
answers a second create with 409 BlobAlreadyExists, as Azure does. One Azurite per session
(support/azurite.py), a fresh container per test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import obstore
import pytest
from obstore.store import AzureStore
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

from delta_mirror.airflow.storage_connections import storage_options_from_connection
from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.errors import PermanentError
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.storage import ObjectExistsError, open_store, storage_options_for


@pytest.fixture(scope="session")
def azurite() -> Iterator[AzuriteServer]:
    yield from azurite_session()


@pytest.fixture
def container(azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh container; no ``AZURE_*`` from the machine leaks into the test."""
    for var in [v for v in os.environ if v.startswith(("AZURE_", "AZURITE_"))]:
        monkeypatch.delenv(var)
    return azurite.make_container()


def _raw_put(azurite: AzuriteServer, container: str) -> RawPut:
    raw = AzureStore(
        container,
        prefix="t",
        config={"account_name": ACCOUNT, "account_key": ACCOUNT_KEY, "endpoint": azurite.endpoint},
        client_options={"allow_http": True},
    )

    def put(path: str, data: bytes) -> None:
        obstore.put(raw, path, data, use_multipart=False)

    return put


def test_publish_through_the_cli_then_deltalake_reads_it(
    azurite: AzuriteServer, container: str, tmp_path: Path
) -> None:
    location = f"az://{container}/t"
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    _, ids = make_table(store_url, location, _raw_put(azurite, container), tmp_path / "data")

    result = publish_with_cli(store_url, "t", azurite.options())  # credentials from AZURE_* only

    assert result["published"] == VERSIONS and result["checkpoints"] == [4], result
    objects = open_store(location, azurite.options())
    assert_published_log(objects)
    # deltalake reads it through object_store's Azure client, by either URL form
    assert deltalake_rows(location, storage_options_for(location, azurite.options())) == (VERSIONS - 1, ids)
    abfss = f"abfss://{container}@{ACCOUNT}.dfs.core.windows.net/t"
    assert deltalake_rows(abfss, azurite.options()) == (VERSIONS - 1, ids)


def test_a_racing_second_writer_gets_already_exists_and_a_reput_is_idempotent(
    azurite: AzuriteServer, container: str, tmp_path: Path
) -> None:
    location = f"az://{container}/t"
    race_put_if_absent(lambda: open_store(location, azurite.options()), f"{LOG_DIR}/{commit_name(7)}")

    store, _ = make_table(
        f"sqlite:///{tmp_path / 'store.db'}", location, _raw_put(azurite, container), tmp_path / "data"
    )
    publisher = Publisher(store, retry=NO_RETRY, storage_options=azurite.options())
    assert publisher.publish("t").published == list(range(VERSIONS))
    objects = open_store(location, azurite.options())
    assert_second_writer_refused(objects, f"{LOG_DIR}/{commit_name(0)}")
    assert_identical_reput_is_idempotent(store, publisher)


def test_a_different_existing_commit_halts_the_table(
    azurite: AzuriteServer, container: str, tmp_path: Path
) -> None:
    location = f"abfss://{container}@{ACCOUNT}.dfs.core.windows.net/t"  # the Hadoop form, same blobs
    store, _ = make_table(
        f"sqlite:///{tmp_path / 'store.db'}", location, _raw_put(azurite, container), tmp_path / "data"
    )
    publisher = Publisher(store, retry=NO_RETRY, storage_options=azurite.options())
    assert_a_different_commit_halts(store, publisher, open_store(location, azurite.options()))


def test_full_reconcile_lists_and_repairs(azurite: AzuriteServer, container: str, tmp_path: Path) -> None:
    location = f"az://{container}/t"
    store, _ = make_table(
        f"sqlite:///{tmp_path / 'store.db'}", location, _raw_put(azurite, container), tmp_path / "data"
    )
    publisher = Publisher(store, retry=NO_RETRY, storage_options=azurite.options())
    publisher.publish("t")
    assert_full_reconcile_repairs(store, publisher, open_store(location, azurite.options()))


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


REAL_AZURE_ENV = "DELTA_MIRROR_TEST_AZURE_LOCATION"


@pytest.mark.skipif(
    not os.environ.get(REAL_AZURE_ENV),
    reason=f"set {REAL_AZURE_ENV}=az://container/prefix (and AZURE_STORAGE_*) to run on real Azure",
)
def test_put_if_absent_on_real_azure() -> None:
    """On a real account (not in CI): a second create of the same blob is refused, the first kept."""
    check_put_if_absent_on_a_real_bucket(os.environ[REAL_AZURE_ENV])
