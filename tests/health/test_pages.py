"""What the "Delta Mirror" pages show, from a real store and without Airflow (``health/pages.py``):
the reader's visibility decides rows, verdict and counts alike; each store connection is opened
once; a store connection outside Airflow is one clear message."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.builders import add_body, metadata_body, protocol_body

from delta_mirror.errors import TableNotFoundError
from delta_mirror.health.pages import PageStores, health_data, overview_data, table_data
from delta_mirror.store import SqlStore
from delta_mirror.store.states import Artifact
from delta_mirror.table_config import ConfigError


def _table(store: SqlStore, root: Path, name: str) -> None:
    """Two versions, the first published."""
    store.create_table(name, (root / name).as_uri())
    store.commit(name, [("protocol", protocol_body()), ("metaData", metadata_body()), ("add", add_body("a"))])
    store.commit(name, [("add", add_body("b"))])
    store.mark_succeeded(store.get_table(name).id, Artifact.JSON, [(0, "0" * 64, 1)])


@pytest.fixture
def fleet(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PageStores]:
    """``ok``, ``other`` and ``broken`` (a failed version: unhealthy), no table config."""
    monkeypatch.setenv("DELTA_MIRROR_STORE", store_url)
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(tmp_path / "none.yaml"))
    store = SqlStore(store_url)
    store.init()
    for name in ("ok", "other", "broken"):
        _table(store, tmp_path, name)
    store.mark_failed(store.get_table("broken").id, 1, Artifact.JSON, "FAILED", "PERMANENT", "boom")
    store.close()
    stores = PageStores()
    yield stores
    stores.close()


def test_a_hidden_table_leaves_the_rows_the_verdict_and_the_counts_alike(fleet: PageStores) -> None:
    everything = overview_data(fleet)
    assert [r["table"] for r in everything["tables"]] == ["broken", "ok", "other"]
    assert (everything["total"], everything["unhealthy"], everything["healthy"]) == (3, 1, False)

    def visible(name: str) -> bool:
        return name != "broken"

    seen = overview_data(fleet, visible=visible)
    assert [r["table"] for r in seen["tables"]] == ["ok", "other"]
    assert (seen["total"], seen["unhealthy"], seen["healthy"]) == (2, 0, True)
    health = health_data(fleet, visible=visible)
    assert health["healthy"] is True and [t["table"] for t in health["tables"]] == ["ok", "other"]
    assert health_data(fleet)["healthy"] is False


def test_the_overview_pages_by_name_and_only_the_page_gets_sparklines(fleet: PageStores) -> None:
    data = overview_data(fleet, page=2, per_page=2)
    assert (data["page"], data["pages"], data["per_page"]) == (2, 2, 2)
    assert [r["table"] for r in data["tables"]] == ["other"]
    assert set(data["tables"][0]) >= {"lag_24h", "latency", "dag_id", "healthy"}
    assert overview_data(fleet, page=0, per_page=0)["per_page"] == 1  # clamped, not an error


def test_a_table_page_names_an_unknown_table_and_clamps_its_versions(fleet: PageStores) -> None:
    detail = table_data(fleet, "ok", versions=1)
    assert [v["version"] for v in detail["versions"]] == [1] and detail["versions_total"] == 2
    with pytest.raises(TableNotFoundError, match="no table named 'nope'"):
        table_data(fleet, "nope")


def test_each_store_connection_is_opened_once_and_needs_airflow_to_be_resolved(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from delta_mirror.table_config import parse_config

    monkeypatch.setenv("DELTA_MIRROR_STORE", store_url)
    store = SqlStore(store_url)
    store.init()
    store.close()
    config = parse_config(
        "tables:\n  a: {store_conn_id: warehouse}\n  b: {store_conn_id: warehouse}\n  c: {}\n"
    )
    asked: list[str] = []

    def url_of(conn_id: str) -> str:
        asked.append(conn_id)
        return store_url

    stores = PageStores(url_of)
    try:
        assert len(stores.of(config)) == 2  # the default store and "warehouse", each once
        assert stores.of(config)[1] is stores.store("warehouse") and asked == ["warehouse"]
    finally:
        stores.close()
    with pytest.raises(ConfigError, match="store connection 'warehouse'") as info:
        PageStores().of(config)
    assert "Airflow" in str(info.value.hint)


def test_the_pages_data_imports_without_airflow_or_a_template_engine() -> None:
    code = (
        "import sys, delta_mirror.health.pages\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'airflow', 'jinja2', 'fastapi'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
