"""The "Delta Mirror" page's HTML from a real store (no server): what the table page says of versions
and checkpoints. The browser test (test_ui_plugin.py) drives the same pages inside Airflow."""

from __future__ import annotations

from pathlib import Path

from support.builders import append_rows, create_data_table

from delta_mirror.health.monitoring import table_detail
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore


def test_a_rewritten_checkpoint_is_a_second_write_not_a_retried_version(
    sqlite_store: str, tmp_path: Path
) -> None:
    from delta_mirror.airflow.ui_plugin import table_html

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
