"""One SparkSession (local[2], delta-spark) for the whole test session; skipped when Spark cannot start.

Spark tests are skipped with the reason shown in ``-ra`` output when pyspark/delta-spark are not
installed or there is no Java runtime. The Delta jars are resolved from Maven Central on the first
run and cached in ``<repo>/.cache/ivy`` (``DELTA_MIRROR_SPARK_IVY``).

The session loads delta-mirror's LogStore (``make jar``) for the ``file``, ``s3a`` and ``s3``
schemes, with no commit service configured: every table passes through to Delta's default LogStore
until a test sets ``delta.mirror.commit.url``/``roots`` in the Hadoop configuration at runtime (and
unsets them after). Without the jar the session starts without it and ``logstore_loaded`` is False.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

from delta_mirror.spark.session import (
    COMMIT_ROOTS_ENV,
    COMMIT_URL_ENV,
    AuthorityConfig,
    LogStoreJarMissing,
    get_spark,
    logstore_jar,
    spark_missing,
    stop_spark,
)


def _logstore_built() -> bool:
    try:
        logstore_jar()
    except LogStoreJarMissing:
        return False
    return True


@pytest.fixture(scope="session")
def logstore_loaded(spark: Any) -> bool:
    """Whether the shared session runs delta-mirror's LogStore (the jar was built)."""
    impl = spark.sparkContext.getConf().get("spark.delta.logStore.file.impl", "")
    return bool(impl.endswith("SqlAuthorityLogStore"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    why = spark_missing()
    if why is not None:
        pytest.skip(f"Spark tests need Spark: {why}")
    # py4j logs "Closing down clientserver connection" at interpreter exit, after pytest closed its
    # capture streams ("--- Logging error ---"); its INFO messages are noise here anyway
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # a developer's authority settings must not govern the test tables
    for key in (COMMIT_URL_ENV, COMMIT_ROOTS_ENV):
        os.environ.pop(key, None)
    # one partition: the test tables are tiny and the machine has 2 cores
    session = get_spark(
        authority=AuthorityConfig() if _logstore_built() else None,
        **{"spark.databricks.delta.snapshotPartitions": "1", "spark.sql.shuffle.partitions": "1"},
    )
    try:
        yield session
    finally:
        stop_spark()
