"""A SparkSession with delta-spark, for validation and tests (core side: never imports Airflow).

- pyspark and delta-spark are imported lazily (``pip install -e '.[spark]'``: pyspark 4.2.0 and
  delta-spark 4.4.1, a compatible pair).
- The Delta jars (``io.delta:delta-spark_<spark>_2.13:<delta-spark version>``, as delta-spark's
  ``configure_spark_with_delta_pip`` names them; ``DELTA_MIRROR_SPARK_PACKAGES`` overrides) are resolved from Maven Central by Spark's Ivy on first use and cached in the
  project (``<repo>/.cache/ivy``, or ``DELTA_MIRROR_SPARK_IVY``); later sessions start offline.
- Master: the ``master`` argument, else ``DELTA_MIRROR_SPARK_MASTER``, else ``local[2]``.
- Java 17 must be on ``PATH`` or in ``JAVA_HOME``; without it ``SparkUnavailable`` says so.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

from delta_mirror.errors import PermanentError

DEFAULT_MASTER = "local[2]"
MASTER_ENV = "DELTA_MIRROR_SPARK_MASTER"
IVY_ENV = "DELTA_MIRROR_SPARK_IVY"
PACKAGES_ENV = "DELTA_MIRROR_SPARK_PACKAGES"  # e.g. io.delta:delta-spark_4.2_2.13:4.4.0,<more>
_lock = threading.Lock()

# Maven coordinates resolved with the Delta jars (Spark's Ivy, cached like them). One entry per
# capability, so each feature adds its own line: e.g. the PostgreSQL JDBC driver for the Spark
# checkpoint engine, hadoop-aws for s3a:// tables.
EXTRA_PACKAGES: tuple[str, ...] = (
    "org.postgresql:postgresql:42.7.14",  # JDBC reads of the store (spark/checkpoint_engine.py)
    # s3a:// for the spark reader on S3 (spark/s3a.py): hadoop-aws matching pyspark's hadoop-client
    # 3.5.0, with the AWS SDK v2 modules it needs instead of its 686 MB `bundle` (excluded below)
    "org.apache.hadoop:hadoop-aws:3.5.0",
    "software.amazon.awssdk:s3:2.35.4",
    "software.amazon.awssdk:s3-transfer-manager:2.35.4",
)
# groupId:artifactId (globs allowed) left out of the resolution: the SDK bundle (replaced by the
# modules above) and netty (Spark ships its own)
EXTRA_EXCLUDES: tuple[str, ...] = ("software.amazon.awssdk:bundle", "io.netty:*")


class SparkUnavailable(PermanentError):
    """pyspark/delta-spark are not installed, or there is no Java runtime."""


def ivy_dir() -> Path:
    """Where Spark's Ivy caches the Delta jars: ``$DELTA_MIRROR_SPARK_IVY`` or ``<repo>/.cache/ivy``."""
    configured = os.environ.get(IVY_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    here = Path(__file__).resolve()
    for d in here.parents:
        if (d / "pyproject.toml").exists():
            return d / ".cache" / "ivy"
    return Path.home() / ".cache" / "delta-mirror" / "ivy"


def java_missing() -> str | None:
    """Why no Java runtime can be used, or None when one is there."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return None
    if shutil.which("java"):
        return None
    return "no Java runtime (java on PATH or JAVA_HOME); install OpenJDK 17, e.g. `apt-get install openjdk-17-jre-headless`"


def spark_missing() -> str | None:
    """Why Spark cannot start here (no pyspark/delta-spark, no Java), or None."""
    try:
        import delta  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return (
            f"pyspark/delta-spark are not installed ({exc}); run `pip install -e '.[spark]'` (or `make venv`)"
        )
    return java_missing()


def get_spark(master: str | None = None, *, app_name: str = "delta-mirror", **conf: str) -> Any:
    """The process's SparkSession with Delta enabled (created on first call, then reused).

    Extra ``conf`` entries are set on the builder (they only take effect when the session is new).
    """
    why = spark_missing()
    if why is not None:
        raise SparkUnavailable(why, hint="install the spark extra and a Java 17 runtime")
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    with _lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        ivy = ivy_dir()
        ivy.mkdir(parents=True, exist_ok=True)
        builder = (
            SparkSession.builder.appName(app_name)
            .master(master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER)
            .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
            .config("spark.jars.ivy", str(ivy))
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.databricks.delta.snapshotPartitions", "2")  # 50 by default: slow for small logs
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        )
        for key, value in conf.items():
            builder = builder.config(key, value)
        if EXTRA_EXCLUDES:
            builder = builder.config("spark.jars.excludes", ",".join(EXTRA_EXCLUDES))
        packages = os.environ.get(PACKAGES_ENV)
        if packages:
            builder = builder.config("spark.jars.packages", packages)
        else:
            # delta-spark 4.4.1 on PyPI has no jars on Maven Central (404): pin 4.4.0 (requirements.txt)
            builder = configure_spark_with_delta_pip(builder, extra_packages=list(EXTRA_PACKAGES))
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return spark


def stop_spark() -> None:
    """Stop the process's SparkSession, if any."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return
    with _lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()


__all__ = [
    "DEFAULT_MASTER",
    "SparkUnavailable",
    "get_spark",
    "ivy_dir",
    "java_missing",
    "spark_missing",
    "stop_spark",
]
