"""The one SparkSession of a test run, configured the same wherever a test asks for it first.

Spark allows one session per process, and whichever test creates it fixes its settings for the
rest of the run: every test that needs Spark gets it from ``shared_spark()``. The session loads
delta-mirror's LogStore (``make jar``) for ``file``/``s3a``/``s3`` with no commit service set, so
every table passes through to Delta's default LogStore until a test governs a root at runtime
(``delta_mirror.spark.session.governed``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from delta_mirror.spark.session import (
    COMMIT_ROOTS_ENV,
    COMMIT_URL_ENV,
    LOGSTORE_CLASS,
    AuthorityConfig,
    LogStoreJarMissing,
    get_spark,
    logstore_jar,
)
from support.services import refuse_unmarked

# one partition: the test tables are tiny and the machine has 2 cores
TEST_CONF = {"spark.databricks.delta.snapshotPartitions": "1", "spark.sql.shuffle.partitions": "1"}


def logstore_built() -> bool:
    try:
        logstore_jar()
    except LogStoreJarMissing:
        return False
    return True


def shared_spark() -> Any:
    """The process's SparkSession for tests (created on first call)."""
    refuse_unmarked("Spark")
    # py4j logs "Closing down clientserver connection" at interpreter exit, after pytest closed its
    # capture streams ("--- Logging error ---"); its INFO messages are noise here anyway
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # a developer's authority settings must not govern the test tables
    for key in (COMMIT_URL_ENV, COMMIT_ROOTS_ENV):
        os.environ.pop(key, None)
    return get_spark(authority=AuthorityConfig() if logstore_built() else None, **TEST_CONF)


def runs_logstore(spark: Any) -> bool:
    """Whether ``spark`` runs delta-mirror's LogStore (the jar was built when it started)."""
    return str(spark.sparkContext.getConf().get("spark.delta.logStore.file.impl", "")) == LOGSTORE_CLASS
