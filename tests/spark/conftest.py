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

from collections.abc import Iterator
from typing import Any

import pytest
from support.services import skip_or_fail
from support.spark import runs_logstore, shared_spark

from delta_mirror.spark.session import spark_missing, stop_spark


@pytest.fixture(scope="session")
def logstore_loaded(spark: Any) -> bool:
    """Whether the shared session runs delta-mirror's LogStore (the jar was built)."""
    return runs_logstore(spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    why = spark_missing()
    if why is not None:
        skip_or_fail(f"Spark tests need Spark: {why}")
    session = shared_spark()
    try:
        yield session
    finally:
        stop_spark()
