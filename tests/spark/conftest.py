"""One SparkSession (local[2], delta-spark) for the whole test session; skipped when Spark cannot start.

Spark tests are skipped with the reason shown in ``-ra`` output when pyspark/delta-spark are not
installed or there is no Java runtime. The Delta jars are resolved from Maven Central on the first
run and cached in ``<repo>/.cache/ivy`` (``DELTA_MIRROR_SPARK_IVY``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from delta_mirror.spark.session import get_spark, spark_missing, stop_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    why = spark_missing()
    if why is not None:
        pytest.skip(f"Spark tests need Spark: {why}")
    # py4j logs "Closing down clientserver connection" at interpreter exit, after pytest closed its
    # capture streams ("--- Logging error ---"); its INFO messages are noise here anyway
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # one partition: the test tables are tiny and the machine has 2 cores
    session = get_spark(
        **{"spark.databricks.delta.snapshotPartitions": "1", "spark.sql.shuffle.partitions": "1"}
    )
    try:
        yield session
    finally:
        stop_spark()
