"""A table config naming a table the store has never had: the table's publish task fails at once,
without a retry (a ``DeltaMirrorFailure``), in one line naming the config file and what to do, and
nothing is written (health/coverage.py, the publisher's preflight)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from delta_mirror.errors import TableNotFoundError
from delta_mirror.store import SqlStore


@pytest.fixture
def orders_configured(
    store_url: str, dm_config: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Path:
    """``orders`` in the table config (the operators' ``DELTA_MIRROR_CONFIG``), an empty store."""
    store = SqlStore(store_url)
    store.init()
    store.close()
    monkeypatch.setenv("DELTA_MIRROR_STORE", store_url)
    return dm_config({"orders": {"retries": 3}})


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0]


@pytest.mark.parametrize("operator", ["publish", "sync"])
def test_the_publish_and_sync_steps_fail_without_retry_in_one_line(
    orders_configured: Path, store_url: str, tmp_path: Path, operator: str
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from delta_mirror.airflow.errors import DeltaMirrorFailure
    from delta_mirror.airflow.operators import DeltaMirrorPublishOperator, DeltaMirrorSyncOperator

    kind = DeltaMirrorPublishOperator if operator == "publish" else DeltaMirrorSyncOperator

    def files() -> list[str]:  # beside the store's own files (SQLite's -wal and -shm appear on use)
        return sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("store.db"))

    before = files()
    with pytest.raises(DeltaMirrorFailure) as exc:
        kind(task_id=operator, table="orders").execute({})
    assert isinstance(exc.value, AirflowFailException)  # Airflow does not retry it
    assert isinstance(exc.value.error, TableNotFoundError)
    line = _first_line(exc.value)
    assert line.startswith(
        f"[PERMANENT] table 'orders': not in store: configured in {orders_configured}, "
        "but the store has no such table — commit its first version"
    )
    assert "`delta-mirror import <root> --table orders`" in line and line.endswith(
        f"or fix the name in {orders_configured}"
    )
    assert files() == before  # nothing written anywhere
    store = SqlStore(store_url)
    assert store.list_tables() == []
    store.close()


@pytest.mark.usefixtures("airflow_db")
def test_the_tables_dag_run_fails_its_first_try_with_the_line(
    sqlite_store: str, dm_config: Callable[..., Path], capfd: pytest.CaptureFixture[str]
) -> None:
    from dm_airflow_kit import run_dag

    config = dm_config({"orders": {"retries": 3, "retry_delay": "1s"}})

    run = run_dag("delta_mirror__orders")

    publish = run.tasks["publish"]
    assert (run.state, publish.state, publish.try_number) == ("failed", "failed", 1)  # no retry
    out = "".join(capfd.readouterr())  # the task's log
    (line,) = [line for line in out.splitlines() if "TableNotFoundError" in line]
    assert line.startswith(
        f"delta_mirror.errors.TableNotFoundError: table 'orders': not in store: configured in {config}"
    )
