"""The "Delta Mirror" page's HTML from a real store (no server): what the table page says of versions
and checkpoints, and that the store's text is shown escaped. The browser test (test_ui_plugin.py)
drives the same pages inside Airflow."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.builders import append_rows, create_data_table

from delta_mirror.health.monitoring import table_detail
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore


def test_a_rewritten_checkpoint_is_a_second_write_not_a_retried_version(
    sqlite_store: str, tmp_path: Path
) -> None:
    from delta_mirror.airflow.ui_render import table_html

    store = SqlStore(sqlite_store)
    root = tmp_path / "t"
    create_data_table(store, root)
    info = store.get_table("t")
    publisher = Publisher(store)
    append_rows(store, root, "t", [2])
    publisher.publish("t")
    publisher.checkpoint("t", 1)
    publisher.checkpoint("t", 1)  # `delta-mirror checkpoint` again: a deliberate rewrite

    page = table_html(table_detail(store, info))
    checkpoints = page[page.index("id='checkpoints'") :]
    assert "<td class='n'>1</td><td>SUCCESS</td><td class='n'>2</td>" in checkpoints
    problems = page[page.index("Failed and retried versions") : page.index("<h2>Checkpoints")]
    assert "none" in problems and "id='problems'" not in problems
    assert " retried'" not in page  # no version cell outlined as retried


def test_the_overview_sends_as_many_statements_for_30_tables_as_for_3(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row per table from a constant number of queries (statuses, sparklines, breakers)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from support.builders import add_body, metadata_body, protocol_body

    from delta_mirror.airflow.ui_render import overview_html
    from delta_mirror.health.pages import PageStores, overview_data
    from delta_mirror.store.states import Artifact

    monkeypatch.setenv("DELTA_MIRROR_STORE", store_url)
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(tmp_path / "none.yaml"))
    stores = PageStores()
    store = SqlStore(store_url)
    store.init()

    def add_tables(start: int, count: int) -> None:
        for i in range(start, start + count):
            name = f"t{i:03d}"
            store.create_table(name, (tmp_path / name).as_uri())
            store.commit(
                name, [("protocol", protocol_body()), ("metaData", metadata_body()), ("add", add_body("a"))]
            )
            store.commit(name, [("add", add_body("b"))])
            tid = store.get_table(name).id
            store.mark_succeeded(tid, Artifact.JSON, [(0, "0" * 64, 1)])
            store.add_lag_sample(tid, float(i), 1)

    def statements() -> int:
        seen: list[str] = []

        def on_execute(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
            seen.append(statement)

        event.listen(Engine, "before_cursor_execute", on_execute)
        try:
            data = overview_data(stores)
            overview_html(data)
        finally:
            event.remove(Engine, "before_cursor_execute", on_execute)
        assert all(len(r["lag_24h"]) == 1 and r["versions_behind"] == 1 for r in data["tables"])
        return len(seen)

    add_tables(0, 3)
    statements()  # the pages' store is opened once, then kept
    few = statements()
    add_tables(3, 27)
    assert statements() == few
    assert len(overview_data(stores)["tables"]) == 30

    # Pages by name: the rows of one page, the verdict and the count of every table.
    store.mark_failed(store.get_table("t001").id, 1, Artifact.JSON, "FAILED", "TRANSIENT", "503")
    data = overview_data(stores, page=2, per_page=7)
    assert [r["table"] for r in data["tables"]] == [f"t{i:03d}" for i in range(7, 14)]
    assert (data["total"], data["pages"], data["unhealthy"], data["healthy"]) == (30, 5, 1, False)
    page = overview_html(data)
    assert "30 table(s), <span class='bad'>1 unhealthy</span>" in page
    assert "tables 8-14 of 30 (page 2 of 5)" in page and "?page=3&amp;per_page=7'>next" in page
    assert overview_data(stores, page=99, per_page=7)["page"] == 5  # past the end: the last page
    stores.close()
    store.close()


def test_every_text_from_the_store_is_escaped_on_the_pages(sqlite_store: str, tmp_path: Path) -> None:
    """Error texts, halt reasons, locations and validation problems are the store's (and so a
    writer's or an object store's) text: the templates' autoescape shows them, never runs them."""
    from delta_mirror.airflow.ui_render import error_html, overview_html, table_html
    from delta_mirror.health.monitoring import overview_rows
    from delta_mirror.store.states import Artifact

    evil = "<script>alert('x')</script>"
    store = SqlStore(sqlite_store)
    root = tmp_path / "t"
    create_data_table(store, root)
    append_rows(store, root, "t", [2])
    info = store.get_table("t")
    store.mark_failed(info.id, 1, Artifact.JSON, "FAILED", "PERMANENT", evil)
    store.halt_table(info.id, evil, 1)
    store.update_table(info.id, location=f"file:///{evil}")
    detail = table_detail(store, store.get_table("t"))
    detail["last_validation"] = {
        "at": 1_800_000_000_000,
        "from_version": 0,
        "to_version": 1,
        "reader": evil,
        "ok": False,
        "problem_count": 1,
        "problems": [{"kind": evil, "version": 1, "message": evil, "hint": evil}],
    }
    rows = overview_rows(store, [store.get_table("t")])
    pages = {
        "overview": overview_html(
            {"generated_at": "2027-01-01T00:00:00+00:00", "healthy": False, "tables": rows}
        ),
        "table": table_html(detail),
        "error": error_html("No such table", f"no table named '{evil}' in the store"),
    }
    for which, page in pages.items():
        assert "<script>alert" not in page, which
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page, which
        assert page.count("<script>") == 1, which  # the page's own script only
    assert pages["table"].count("&lt;script&gt;") >= 5  # halt, error, location, validation
    store.close()


def test_the_pages_say_not_configured_instead_of_a_lag_and_list_configured_tables_the_store_lacks(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table the table config does not name has no DAG: "not configured: no DAG publishes it"
    where its lag and sparkline would be, and it is not unhealthy however old its commits; a
    configured table no store has is listed once, with what to do (health/coverage.py)."""
    from sqlalchemy import update

    from delta_mirror.airflow.ui_render import error_html, overview_html, table_html
    from delta_mirror.delta.protocol import now_ms
    from delta_mirror.errors import TableNotFoundError
    from delta_mirror.health.coverage import NOT_CONFIGURED
    from delta_mirror.health.pages import PageStores, health_data, overview_data, table_data
    from delta_mirror.store.schema import dl_commits

    config = tmp_path / "delta_mirror.yaml"
    config.write_text("defaults: {lag_slo: 5m}\ntables:\n  sales: {}\n  orders: {}\n", encoding="utf-8")
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(config))
    monkeypatch.setenv("DELTA_MIRROR_STORE", store_url)
    store = SqlStore(store_url)
    store.init()
    for name in ("sales", "events"):
        create_data_table(store, tmp_path / name, name)
    with store.engine.begin() as conn:  # an hour old, unpublished: twelve times the SLO
        conn.execute(update(dl_commits).values(committed_at=now_ms() - 3_600_000))
    Publisher(store).publish("sales")
    stores = PageStores()

    data = overview_data(stores)
    rows = {r["table"]: r for r in data["tables"]}
    assert (rows["events"]["lag_judged"], rows["events"]["configured"]) == (False, False)
    assert rows["events"]["healthy"] and rows["events"]["problems"] == []
    assert (data["healthy"], data["unhealthy"], data["total"]) == (True, 0, 2)
    assert [t["table"] for t in data["not_in_store"]] == ["orders"]
    page = overview_html(data)
    events_row = page[page.index("/tables/events'") : page.index("</tr>", page.index("/tables/events'"))]
    assert "<td colspan='2' class='muted not-configured'" in events_row
    assert f">{NOT_CONFIGURED}</td>" in events_row and "<svg" not in events_row  # no lag, no sparkline
    assert "no DAG</span>" in events_row  # and no link to a DAG that does not exist
    sales_row = page[page.index("/tables/sales'") : page.index("</tr>", page.index("/tables/sales'"))]
    assert NOT_CONFIGURED not in sales_row and "<svg" in sales_row
    missing = page[page.index("<ul id='not-in-store'>") :]
    assert f"<b>orders</b>: <span class='err'>not in store: configured in {config}, but the store" in missing
    assert "/dags/delta_mirror__orders" in missing

    table_page = table_html(table_data(stores, "events"))
    assert f"<span class='not-configured'>{NOT_CONFIGURED}</span> (1 not published)" in table_page
    assert f"list it under `tables:` in {config}" in table_page

    with pytest.raises(TableNotFoundError) as missing_table:
        table_data(stores, "orders")  # the app answers 404 with this line (ui_app._call)
    assert f"table 'orders': not in store: configured in {config}" in missing_table.value.message
    assert "`delta-mirror import &lt;root&gt; --table orders`" in error_html(
        "No such table", missing_table.value.message
    )

    # who may not read the DAG of orders does not see it listed either (ui_app.TableAccess.visible)
    assert overview_data(stores, visible=lambda n: n != "orders")["not_in_store"] == []
    assert [t["table"] for t in health_data(stores, visible=lambda n: n != "orders")["tables"]] == [
        "events",
        "sales",
    ]
    health = {t["table"]: t for t in health_data(stores)["tables"]}
    assert health_data(stores)["healthy"] is True and list(health) == ["events", "sales", "orders"]
    assert health["events"]["warnings"][0].startswith(NOT_CONFIGURED)
    assert health["orders"]["healthy"] and "not in store" in health["orders"]["warnings"][0]
    stores.close()
    store.close()
