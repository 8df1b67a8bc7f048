"""A Spark job configured only from the environment keeps committing when commit-service replica 1
is SIGKILLed (issue 40): ``DELTA_MIRROR_COMMIT_URL`` lists both replicas (two ``delta-mirror serve``
processes over one PostgreSQL store), ``AuthorityConfig.from_env()`` hands that list to the
LogStore as it is, and the writer's next commits go to replica 2. The shared SparkSession runs the
LogStore already, so the authority is applied with ``governed`` (what ``get_spark()`` sets at start
from the same variable); its JVM predates the test's environment, so the token is passed along."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from authority_kit import spark_root
from support.commit_service import CommitService
from support.services import skip_or_fail
from support.waiting import load_scaled
from test_spark_failover import append, assert_committed_once, assert_reads_appends, established, lake

from delta_mirror.spark.session import AuthorityConfig, governed


@pytest.fixture(autouse=True)
def _needs_the_logstore(logstore_loaded: bool) -> None:
    if not logstore_loaded:
        skip_or_fail("the authority LogStore jar is not built (`make jar` needs Maven and a JDK 17)")


def test_a_job_configured_from_the_environment_fails_over_when_replica_1_is_killed(
    spark: Any, pg_store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, root, location = lake(pg_store_url, tmp_path)
    first = CommitService(pg_store_url, [root.as_uri()])
    second = CommitService(pg_store_url, [root.as_uri()])
    second.token = first.token
    monkeypatch.delenv("DELTA_MIRROR_COMMIT_URLS", raising=False)
    monkeypatch.setenv("DELTA_MIRROR_COMMIT_URL", f"{first.url},{second.url}")
    monkeypatch.setenv("DELTA_MIRROR_COMMIT_ROOTS", spark_root(root))
    monkeypatch.setenv("DELTA_MIRROR_COMMIT_TOKEN", first.token)
    authority = AuthorityConfig.from_env()
    assert authority is not None and authority.url == f"{first.url},{second.url}"
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    conf.set("delta.mirror.commit.timeoutMs", str(int(load_scaled(30) * 1000)))
    try:
        first.start()
        second.start()
        with governed(spark, authority, os.environ["DELTA_MIRROR_COMMIT_TOKEN"]):
            append(spark, location, 0)
            assert established(first.port) >= 1 and established(second.port) == 0  # replica 1 served it
            first.kill()  # SIGKILL, and waited for
            assert first.proc is not None and first.proc.returncode == -9
            append(spark, location, 1)
            append(spark, location, 2)
            assert established(second.port) >= 1  # replica 2 took the commits
        assert_committed_once(store, "events", location, 3)
        assert_reads_appends(spark, location, 3)
    finally:
        conf.unset("delta.mirror.commit.timeoutMs")
        first.stop()
        second.stop()
        store.close()
