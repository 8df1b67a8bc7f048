"""The Spark checkpoint engine's JDBC source on a replicated store (issue 40): ``urls.jdbc_url`` of
a multi-host store URL (``target_session_attrs=read-write``, the standby listed first) is read by
the real PgJDBC driver in the shared SparkSession from the primary, every host kept."""

from __future__ import annotations

from typing import Any

import pytest
from support.pg_pair import PgPair

from delta_mirror.store.urls import jdbc_url

pytestmark = pytest.mark.postgres


def test_spark_reads_the_store_over_jdbc_from_the_primary_of_a_multi_host_url(spark: Any) -> None:
    pair = PgPair.start(synchronous=False)
    try:
        standby_first = pair.url.replace(
            f"host=127.0.0.1:{pair.primary.port}&host=127.0.0.1:{pair.standby.port}",
            f"host=127.0.0.1:{pair.standby.port}&host=127.0.0.1:{pair.primary.port}",
        )
        assert standby_first != pair.url
        url, props = jdbc_url(standby_first)
        assert url.endswith(
            f"//127.0.0.1:{pair.standby.port},127.0.0.1:{pair.primary.port}/dm_store?targetServerType=primary"
        )
        assert props["connectTimeout"] == "3"  # the URL's connect_timeout, in PgJDBC's name
        rows = spark.read.jdbc(
            url, "(SELECT pg_is_in_recovery() AS standby, inet_server_port() AS port) AS q", properties=props
        ).collect()
        assert [(r["standby"], r["port"]) for r in rows] == [(False, pair.primary.port)]
    finally:
        pair.stop()
