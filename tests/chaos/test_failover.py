"""The store's PostgreSQL primary lost under load, reduced (``make chaos-failover`` runs it at scale,
both modes): a primary and a synchronous standby, two ``delta-mirror serve`` replicas on the
multi-host store URL, four writers, a publisher looping over two tables and the event-table trigger
path (a ``CommitWatcher`` and ``publish_from_watcher``) over the other two; the replication link
stalled, the primary SIGKILLed mid-load and the standby promoted (``failover.py``).

With synchronous replication no commit the service acknowledged is lost; no version is duplicated or
published with bytes the store does not have; every writer commits again, the first within seconds of
the kill; every stored version is published; the watcher's ``LISTEN`` reconnects to the promoted
node.
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
    watcher = result.publishers[1]
    assert watcher["listens"] >= 2, f"the watcher's LISTEN did not reconnect after the failover: {watcher}"
