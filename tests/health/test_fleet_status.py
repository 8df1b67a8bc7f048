"""Fleet status at any size: ``status``, ``health``, the monitor DAG's lag step and the UI overview send
a constant number of SQL statements however many tables the store holds (SQLite and PostgreSQL),
and say of each table what the per-table reads say."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from support.builders import add_body, metadata_body, protocol_body

from delta_mirror.cli import cli
from delta_mirror.health.monitoring import health_report, record_lag_samples, table_detail
from delta_mirror.health.status import fleet_status
from delta_mirror.store import SqlStore
from delta_mirror.store.states import Artifact, PublishState


@contextmanager
def counted() -> Iterator[list[str]]:
    """Every statement any engine sends meanwhile (a class-level ``before_cursor_execute`` listener)."""
    seen: list[str] = []

    def on_execute(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", on_execute)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", on_execute)


def _add_tables(store: SqlStore, tmp_path: Path, start: int, count: int) -> None:
    """Tables of 3 versions: published, pending, failed, conflicting or checkpointed by turns."""
    for i in range(start, start + count):
        name = f"t{i:03d}"
        store.create_table(name, (tmp_path / name).as_uri())
        store.commit(
            name, [("protocol", protocol_body()), ("metaData", metadata_body()), ("add", add_body("a"))]
        )
        for v in (1, 2):
            store.commit(name, [("add", add_body(f"f{v}"))])
        tid = store.get_table(name).id
        kind = i % 4
        if kind != 1:  # 1: all pending
            store.mark_succeeded(tid, Artifact.JSON, [(0, "0" * 64, 1), (1, "0" * 64, 1)])
        if kind == 2:
            store.mark_failed(tid, 2, Artifact.JSON, PublishState.FAILED, "TRANSIENT", f"503 for {name}")
        if kind == 3:
            store.ensure_status(tid, 1, Artifact.CHECKPOINT)
            store.mark_succeeded(tid, Artifact.CHECKPOINT, [(1, "1" * 64, 10)])
            store.mark_failed(tid, 2, Artifact.JSON, PublishState.CONFLICT, "CONFLICT", "another file")


def _statements(fn: Callable[[], object]) -> int:
    with counted() as seen:
        fn()
    return len(seen)


def _cli(store_url: str, *args: str) -> Callable[[], object]:
    def run() -> object:
        result = CliRunner().invoke(
            cli, ["--store", store_url, *args], env={"DELTA_MIRROR_CONFIG": "/nonexistent/delta_mirror.yaml"}
        )
        assert result.exit_code in (0, 1), result.output
        return json.loads(result.stdout)

    return run


def test_status_health_and_lag_step_send_as_many_statements_for_30_tables_as_for_3(
    store_url: str, tmp_path: Path
) -> None:
    store = SqlStore(store_url)
    store.init()
    steps: dict[str, Callable[[], object]] = {
        "fleet_status": lambda: fleet_status(store, store.list_tables()),
        "health_report": lambda: health_report(store),
        "lag_step": lambda: record_lag_samples(store, store.list_tables()),
        "status --json": _cli(store_url, "status", "--json"),
        "health --json": _cli(store_url, "health", "--json"),
    }
    _add_tables(store, tmp_path, 0, 3)
    few = {k: _statements(fn) for k, fn in steps.items()}
    _add_tables(store, tmp_path, 3, 27)
    many = {k: _statements(fn) for k, fn in steps.items()}
    assert many == few
    assert few["fleet_status"] <= 9  # list_tables, 4 fleet reads, breakers (+ SQLite's BEGINs)

    # The fleet read says of each table what the per-table reads say.
    for st, t in zip(fleet_status(store, store.list_tables()), store.list_tables(), strict=True):
        assert st.latest_committed == store.latest_version(t.id) == 2
        assert st.last_published == store.last_published_version(t.id)
        assert st.last_checkpoint == store.last_checkpoint_version(t.id)
        json_rows = store.status_rows(t.id, artifact=Artifact.JSON)
        open_states = (PublishState.PENDING, PublishState.IN_PROGRESS)
        assert st.pending == sum(r.state in open_states for r in json_rows)
        kind = int(t.name[1:]) % 4
        assert (st.failed, st.conflicts) == ((1, 0) if kind == 2 else (0, 1) if kind == 3 else (0, 0))
        assert st.last_error == (f"503 for {t.name}" if kind == 2 else "another file" if kind == 3 else None)
        assert st.versions_behind == (3 if kind == 1 else 1)  # all pending, or version 2 open
    by_name = {s.table: s for s in fleet_status(store, store.list_tables())}
    assert by_name["t002"].last_published == 1 and by_name["t001"].last_published is None
    (one,) = fleet_status(store, [store.get_table("t002")])  # one table: the same figures (lag moves on)
    assert replace(one, lag_seconds=0.0) == replace(by_name["t002"], lag_seconds=0.0)

    # --limit: the first tables by name, and the text says how many there are.
    assert [r["table"] for r in _cli(store_url, "status", "--json", "--limit", "2")()] == ["t000", "t001"]  # type: ignore[attr-defined]
    text_out = (
        CliRunner()
        .invoke(
            cli,
            ["--store", store_url, "status", "--limit", "2"],
            env={"DELTA_MIRROR_CONFIG": "/nonexistent/delta_mirror.yaml"},
        )
        .output
    )
    assert "t001" in text_out and "t002" not in text_out and "(2 of 30 tables shown: --limit 2)" in text_out

    # The lag step stored one sample per table per run (two runs above).
    t0 = store.get_table("t000")
    assert len(store.lag_samples(t0.id)) == 2
    store.close()


def test_the_table_page_shows_the_latest_versions_and_checkpoints_of_their_totals(
    store_url: str, tmp_path: Path
) -> None:
    store = SqlStore(store_url)
    store.init()
    _add_tables(store, tmp_path, 3, 1)  # t003: checkpoint at 1, version 2 conflicting
    t = store.get_table("t003")
    for v in (3, 4, 5):
        store.commit("t003", [("add", add_body(f"g{v}"))])
    store.ensure_status(t.id, 0, Artifact.CHECKPOINT)
    store.mark_succeeded(t.id, Artifact.CHECKPOINT, [(0, "2" * 64, 10)])
    page = table_detail(store, t, versions=2, checkpoints=1)
    assert [v["version"] for v in page["versions"]] == [4, 5] and page["versions_total"] == 6
    assert [c["version"] for c in page["checkpoints"]] == [1] and page["checkpoints_total"] == 2
    store.close()


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_the_fleet_reads_use_indexes_not_a_scan_of_the_history(store_url: str, tmp_path: Path) -> None:
    """EXPLAIN with sequential scans priced out: each per-table lookup of dl_commits and dl_mirror_status
    has an index path (a plan with ``Seq Scan on`` either would read every version of every table)."""
    from delta_mirror.store import mirror_status

    store = SqlStore(store_url)
    store.init()
    _add_tables(store, tmp_path, 0, 4)
    queries = [mirror_status._FLEET_TOPS, mirror_status._FLEET_OPEN, mirror_status._FLEET_OPEN_TIMES]
    queries.append(mirror_status._FLEET_LAST_ERRORS)
    with store.engine.connect() as conn:
        conn.execute(text("SET enable_seqscan = off"))
        for sql in queries:
            plan = "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + sql.format(where="", and_ids=""))))
            assert "Seq Scan on dl_commits" not in plan and "Seq Scan on dl_mirror_status" not in plan, plan
    store.close()
