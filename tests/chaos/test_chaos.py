"""Every fault-injection scenario at small scale: after the faults stop, the invariants
(docs/architecture.md) hold again.

The same scenarios run at scale with ``make chaos`` (``tests/chaos/run.py``). Each test asserts what
the independent checker (``chaos_invariants.py``) found: nothing lost, duplicated, corrupted or
overwritten, no broken invariant, ``validate`` clean, status truthful — and the recovery took at
most two reconcile cycles.

The racing publishers and the SIGKILLed ones run on a MySQL/MariaDB store too. Not on DuckDB: every
scenario runs publishers as processes of their own beside a writer, and a DuckDB file takes one
process at a time (its crash recovery is tests/test_failpoints.py's, in sequence).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from chaos_harness import ProxyProcess
from chaos_results import SMALL, ScenarioResult, Services
from chaos_scenarios import (
    external_writer,
    kills,
    pg_restarts,
    race,
    s3_faults,
    target_faults,
)

pytestmark = [pytest.mark.s3, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def chaos(s3: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    proxy = ProxyProcess(s3.endpoint, seed=7)  # type: ignore[attr-defined]
    try:
        yield Services(tmp_path_factory.mktemp("chaos"), s3, proxy, None, seed=7)
    finally:
        proxy.stop()


def _assert_survived(result: ScenarioResult) -> None:
    assert result.faults > 0, "no fault was injected"
    assert result.committed > 0 and result.published == result.committed, result.to_json()
    assert (result.lost, result.duplicated, result.corrupted, result.overwritten) == (0, 0, 0, 0), (
        result.to_json()
    )
    assert result.violations == [], result.violations
    assert 1 <= result.recover_cycles <= 2, result.to_json()


def test_s3_errors_timeouts_and_resets_lose_nothing_and_overwrite_nothing(chaos: Services) -> None:
    result = s3_faults(chaos, SMALL)
    _assert_survived(result)
    assert len(result.fault_kinds) >= 3, result.fault_kinds


def test_publishers_killed_at_failpoints_and_random_times_recover(chaos: Services) -> None:
    result = kills(chaos, SMALL)
    _assert_survived(result)
    assert result.faults >= SMALL.kills


def test_publishers_killed_at_failpoints_and_random_times_recover_on_mysql(
    chaos: Services, mysql_store_url: str
) -> None:
    result = kills(chaos, SMALL, mysql_store_url)
    assert result.notes["backend"] == "mysql"
    _assert_survived(result)
    assert result.faults >= SMALL.kills


@pytest.mark.postgres
def test_postgres_restarts_while_publishing(chaos: Services, pg_server: object) -> None:
    if not pg_server.owned:  # type: ignore[attr-defined]
        pytest.skip("needs the throwaway PostgreSQL server (it is restarted)")
    chaos.pg = pg_server
    result = pg_restarts(chaos, SMALL)
    _assert_survived(result)


def test_two_publishers_racing_on_the_same_tables(chaos: Services) -> None:
    result = race(chaos, SMALL, 2)
    assert result.committed > 0 and result.published == result.committed
    assert result.violations == [] and (result.lost, result.duplicated, result.overwritten) == (0, 0, 0)
    assert result.recover_cycles <= 2


def test_two_publishers_racing_on_the_same_tables_on_mysql(chaos: Services, mysql_store_url: str) -> None:
    result = race(chaos, SMALL, 2, mysql_store_url)
    assert result.notes["backend"] == "mysql + local"
    assert result.committed > 0 and result.published == result.committed
    assert result.violations == [] and (result.lost, result.duplicated, result.overwritten) == (0, 0, 0)
    assert result.recover_cycles <= 2


@pytest.mark.postgres
def test_four_publishers_racing_through_a_faulty_s3(chaos: Services, pg_server: object) -> None:
    chaos.pg = pg_server
    result = race(chaos, SMALL, 4)
    assert result.notes["backend"].startswith("postgresql")
    assert result.committed > 0 and result.published == result.committed
    assert result.violations == [] and (result.lost, result.duplicated, result.overwritten) == (0, 0, 0)
    assert result.recover_cycles <= 2


def test_an_external_writer_is_detected_halted_and_never_overwritten(chaos: Services) -> None:
    result = external_writer(chaos, SMALL)
    _assert_survived(result)
    assert result.notes["detected_and_halted"] == result.faults


def test_a_read_only_or_full_target_fails_the_run_and_recovers(chaos: Services) -> None:
    result = target_faults(chaos, SMALL)
    _assert_survived(result)
    assert result.notes["runs_refused"] == result.faults
