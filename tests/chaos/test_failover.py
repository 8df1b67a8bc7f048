"""The store's PostgreSQL primary lost under load, reduced (``make chaos-failover`` runs it at scale,
both modes): a primary and a synchronous standby, two ``delta-mirror serve`` replicas on the
multi-host store URL, four writers and a publisher; the primary SIGKILLed mid-load and the standby
promoted (``failover.py``).

With synchronous replication no commit the service acknowledged is lost; no version is duplicated or
published with bytes the store does not have; every writer commits again, the first within seconds of
the kill; every stored version is published.
"""

from __future__ import annotations

import pytest
from failover import REDUCED, run_mode
from support.waiting import load_scaled

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(600)]


def test_a_primary_lost_under_load_with_a_synchronous_standby_loses_no_acknowledged_commit() -> None:
    result = run_mode("sync", REDUCED)
    assert result.acknowledged > 0 and result.commits_after_kill > 0, result
    assert (result.lost, result.lost_versions) == (0, []), result
    assert (result.duplicated, result.other_bytes, result.missing_from_store) == (0, 0, 0), result
    assert result.writers_resumed == REDUCED.tables, result
    assert result.kill_to_first_commit_s is not None
    assert result.kill_to_first_commit_s < REDUCED.promote_after + load_scaled(10), result
    assert result.kill_to_all_published_s is not None, f"not every stored version was published: {result}"
