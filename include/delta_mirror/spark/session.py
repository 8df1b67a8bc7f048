"""A SparkSession with delta-spark, for validation, the Spark jobs and tests (core side: never
imports Airflow). It only builds a session (like ``storage/`` opens object stores), so it sits
at the bottom tier although it lives in ``spark/`` with the rest of the Spark code: ``jobs/`` (the
Spark reader) and ``spark/`` (ingest, the checkpoint engine) can both use it.

- pyspark and delta-spark are imported lazily (``pip install -e '.[spark]'``: pyspark 4.2.0 and
  delta-spark 4.4.1, a compatible pair).
- The Delta jars (``io.delta:delta-spark_<spark>_2.13:<delta-spark version>``, as delta-spark's
  ``configure_spark_with_delta_pip`` names them; ``DELTA_MIRROR_SPARK_PACKAGES`` overrides) are resolved from Maven Central by Spark's Ivy on first use and cached in the
  project (``<repo>/.cache/ivy``, or ``DELTA_MIRROR_SPARK_IVY``); later sessions start offline.
- Master: the ``master`` argument, else ``DELTA_MIRROR_SPARK_MASTER``, else ``local[2]``.
- Java 17 must be on ``PATH`` or in ``JAVA_HOME``; without it ``SparkUnavailable`` says so.
- Spark writers through the SQL authority (docs/commit-service.md): ``get_spark(authority=...)``, or
  ``DELTA_MIRROR_COMMIT_URL`` (one URL or every replica's, comma-separated; + ``DELTA_MIRROR_COMMIT_ROOTS``), loads the delta-mirror LogStore jar
  (``make jar``) for the ``file``, ``s3a`` and ``s3`` schemes. Nothing configured: plain Delta.
- Executors (e.g. on a standalone master) fetch every jar from the driver: the resolved packages
  stay in ``spark.jars`` beside the LogStore jar (``_keep_resolved_jars``), no shared file system.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from delta_mirror.errors import PermanentError
from delta_mirror.extras import require

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
    # s3a:// for the spark reader on S3 (s3a.py): hadoop-aws matching pyspark's hadoop-client
    # 3.5.0, with the AWS SDK v2 modules it needs instead of its 686 MB `bundle` (excluded below)
    "org.apache.hadoop:hadoop-aws:3.5.0",
    "software.amazon.awssdk:s3:2.35.4",
    "software.amazon.awssdk:s3-transfer-manager:2.35.4",
)
# groupId:artifactId (globs allowed) left out of the resolution: the SDK bundle (replaced by the
# modules above) and netty (Spark ships its own)
EXTRA_EXCLUDES: tuple[str, ...] = ("software.amazon.awssdk:bundle", "io.netty:*")


# The Delta LogStore committing through `delta-mirror serve` (jvm/logstore, docs/commit-service.md)
LOGSTORE_CLASS = "io.github.deltamirror.logstore.SqlAuthorityLogStore"
LOGSTORE_SCHEMES: tuple[str, ...] = ("file", "s3a", "s3")
COMMIT_URL_ENV = "DELTA_MIRROR_COMMIT_URL"  # one commit-service URL, or every replica's, comma-separated
COMMIT_URLS_ENV = "DELTA_MIRROR_COMMIT_URLS"  # deprecated alias of COMMIT_URL_ENV (read, warned once)
COMMIT_ROOTS_ENV = "DELTA_MIRROR_COMMIT_ROOTS"  # comma-separated root prefixes
# Another LogStore jar to use: the Compose image keeps its build outside include/, which the stack
# mounts over the installed package (docker/Dockerfile.airflow)
LOGSTORE_JAR_ENV = "DELTA_MIRROR_LOGSTORE_JAR"
OUTSIDE_MODES = ("passthrough", "refuse")


log = logging.getLogger(__name__)
_warned_alias = False


def commit_url_list(value: str, source: str = COMMIT_URL_ENV) -> list[str]:
    """The commit-service URLs of a comma-separated list (one URL is a list of one), in order: the
    LogStore tries them in this order and fails over to the next. A URL that is not ``http(s)://``
    is refused in one line naming ``source``."""
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    for url in urls:
        if urlparse(url).scheme not in ("http", "https") or not urlparse(url).netloc:
            raise PermanentError(
                f"{source} holds {url.split('@')[-1]!r}, which is not an http(s):// URL",
                hint=f"set {COMMIT_URL_ENV} to the commit service's URL, or every replica's comma-separated "
                "(http://host1:8787,http://host2:8787)",
            )
    return urls


def commit_url_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """Every commit-service URL the environment names, comma-separated (None: none).

    ``DELTA_MIRROR_COMMIT_URL`` takes one URL or every replica's, comma-separated. The older
    ``DELTA_MIRROR_COMMIT_URLS`` is still read when ``DELTA_MIRROR_COMMIT_URL`` is not set, with a
    warning once per process; when both are set, ``DELTA_MIRROR_COMMIT_URL`` wins.
    """
    global _warned_alias
    env = os.environ if environ is None else environ
    value, source = (env.get(COMMIT_URL_ENV) or "").strip(), COMMIT_URL_ENV
    alias = (env.get(COMMIT_URLS_ENV) or "").strip()
    if alias and not _warned_alias:
        _warned_alias = True
        log.warning(
            "%s is deprecated and %s: set %s to the comma-separated list instead",
            COMMIT_URLS_ENV,
            "ignored beside " + COMMIT_URL_ENV if value else "read for now",
            COMMIT_URL_ENV,
        )
    if not value and alias:
        value, source = alias, COMMIT_URLS_ENV
    urls = commit_url_list(value, source)
    return ",".join(urls) or None


class SparkUnavailable(PermanentError):
    """pyspark/delta-spark are not installed, or there is no Java runtime."""


class LogStoreJarMissing(PermanentError):
    """The delta-mirror LogStore jar has not been built (``make jar``)."""


@dataclass(frozen=True)
class AuthorityConfig:
    """Where Spark's Delta commits go: the commit service's ``url`` for tables under ``roots``.

    ``AuthorityConfig()`` (no url) loads the LogStore with every table passing through, so that
    ``delta.mirror.commit.*`` can be set later at runtime in the Hadoop configuration. ``outside``:
    ``passthrough`` (the LogStore's default) or ``refuse`` commits of tables outside ``roots``. The
    token is never a Spark setting (it would show in the UI and event logs): the driver reads
    ``DELTA_MIRROR_COMMIT_TOKEN`` from its environment.
    """

    url: str | None = None
    roots: tuple[str, ...] = ()
    outside: str | None = None

    def __post_init__(self) -> None:
        if self.outside is not None and self.outside not in OUTSIDE_MODES:
            raise PermanentError(
                f"unknown outside mode {self.outside!r}", hint=f"use one of {', '.join(OUTSIDE_MODES)}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AuthorityConfig | None:
        """From ``DELTA_MIRROR_COMMIT_URL`` (one URL or every replica's, comma-separated: the
        LogStore fails over across them) and ``DELTA_MIRROR_COMMIT_ROOTS``; None without a URL."""
        env = os.environ if environ is None else environ
        url = commit_url_from_env(env)
        if not url:
            return None
        roots = tuple(r.strip() for r in (env.get(COMMIT_ROOTS_ENV) or "").split(",") if r.strip())
        return cls(url=url, roots=roots)


def logstore_jar() -> Path:
    """The built LogStore jar: ``$DELTA_MIRROR_LOGSTORE_JAR``, else ``include/delta_mirror/spark/jars/``
    (beside the Spark integration it serves, where ``make jar`` puts it);
    ``LogStoreJarMissing`` when it is not a file."""
    override = os.environ.get(LOGSTORE_JAR_ENV)
    jar = (
        Path(override) if override else Path(__file__).resolve().parent / "jars" / "delta-mirror-logstore.jar"
    )
    if not jar.is_file():
        raise LogStoreJarMissing(
            f"the delta-mirror LogStore jar is not built ({jar})",
            hint="run `make jar` (needs Maven and a JDK 17)",
        )
    return jar


def authority_conf(authority: AuthorityConfig, spark_jars: str | None = None) -> dict[str, str]:
    """Spark settings that route Delta commits through the LogStore for ``authority``.

    ``spark_jars`` is an existing ``spark.jars`` value, kept ahead of the LogStore jar.
    """
    jars = [j for j in (spark_jars or "").split(",") if j.strip()]
    jar = str(logstore_jar())
    if jar not in jars:
        jars.append(jar)
    conf = {"spark.jars": ",".join(jars)}
    for scheme in LOGSTORE_SCHEMES:
        conf[f"spark.delta.logStore.{scheme}.impl"] = LOGSTORE_CLASS
    if authority.url:
        conf["spark.hadoop.delta.mirror.commit.url"] = authority.url
    if authority.roots:
        conf["spark.hadoop.delta.mirror.commit.roots"] = ",".join(authority.roots)
    if authority.outside:
        conf["spark.hadoop.delta.mirror.commit.outside"] = authority.outside
    return conf


# The LogStore's settings in the Hadoop configuration (docs/commit-service.md); it reads them at
# every call, so they can be changed on a running session.
_RUNTIME_KEYS = {
    "url": "delta.mirror.commit.url",
    "roots": "delta.mirror.commit.roots",
    "outside": "delta.mirror.commit.outside",
    "token": "delta.mirror.commit.token",
}


@contextmanager
def governed(spark: Any, authority: AuthorityConfig, token: str | None = None) -> Iterator[None]:
    """Route the running session's Delta commits through ``authority`` while the block runs.

    For a session that already runs the LogStore (``authority_conf`` at start, e.g. with
    ``AuthorityConfig()``): the settings go into its Hadoop configuration and the previous values
    come back afterwards. ``token`` is only needed when the driver's environment has no
    ``DELTA_MIRROR_COMMIT_TOKEN`` (that one wins); it is never logged.
    """
    impl = spark.sparkContext.getConf().get("spark.delta.logStore.file.impl", "")
    if impl != LOGSTORE_CLASS:
        raise PermanentError(
            "this Spark session was started without the delta-mirror LogStore",
            hint="start it with get_spark(authority=AuthorityConfig(...)) or the spark-submit flags "
            "in docs/writing-from-spark.md",
        )
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    values = {
        "url": authority.url,
        "roots": ",".join(authority.roots),
        "outside": authority.outside,
        "token": token,
    }
    previous = {key: conf.get(name) for key, name in _RUNTIME_KEYS.items()}
    for key, value in values.items():
        if value:
            conf.set(_RUNTIME_KEYS[key], value)
        else:
            conf.unset(_RUNTIME_KEYS[key])
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                conf.unset(_RUNTIME_KEYS[key])
            else:
                conf.set(_RUNTIME_KEYS[key], value)


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


def get_spark(
    master: str | None = None,
    *,
    app_name: str = "delta-mirror",
    authority: AuthorityConfig | None = None,
    **conf: str,
) -> Any:
    """The process's SparkSession with Delta enabled (created on first call, then reused).

    Extra ``conf`` entries are set on the builder (they only take effect when the session is new).
    ``authority`` (else ``AuthorityConfig.from_env()``) loads the LogStore that commits through the
    SQL authority; without either, Delta's own LogStores are used.
    """
    require("pyspark", "spark", "Spark")
    require("delta", "spark", "Spark (delta-spark)")
    why = spark_missing()
    if why is not None:
        raise SparkUnavailable(why, hint="install the spark extra and a Java 17 runtime")
    if authority is None:
        authority = AuthorityConfig.from_env()
    if authority is not None:
        conf = {**conf, **authority_conf(authority, conf.get("spark.jars"))}
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
        builder = _keep_resolved_jars(builder)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return spark


def _jar_path(jar: str) -> str:
    """A ``spark.jars`` entry as a path, so ``/a.jar``, ``file:/a.jar`` and ``file:///a.jar`` compare equal."""
    return os.path.normpath(urlparse(jar.strip()).path)


def _keep_resolved_jars(builder: Any) -> Any:
    """Keep the jars resolved from ``spark.jars.packages`` when the builder also sets ``spark.jars``.

    pyspark starts the JVM through spark-submit, which appends the resolved packages to
    ``spark.jars``; the context's conf then takes the builder's own ``spark.jars`` (e.g. the
    LogStore jar), dropping them. The driver still has them on its class path, so local mode works,
    but standalone executors never receive them (``ClassNotFoundException: org.postgresql.Driver``
    in the Spark checkpoint engine). So the JVM is started here with the builder's options and
    spark-submit's merged list becomes the builder's ``spark.jars``: executors fetch every jar from
    the driver, no shared file system needed.
    """
    options: dict[str, str] = dict(builder._options)  # pyspark keeps builder settings there
    own = [j.strip() for j in options.get("spark.jars", "").split(",") if j.strip()]
    if not own:
        return builder  # spark-submit's merged spark.jars reaches the context untouched
    from pyspark import SparkConf, SparkContext

    launch = SparkConf(loadDefaults=False)
    for key, value in options.items():
        launch.set(key, value)
    SparkContext._ensure_initialized(conf=launch)  # no-op when this process's JVM already runs
    jvm: Any = SparkContext._jvm
    submitted = jvm.java.lang.System.getProperty("spark.jars") or ""
    jars, seen = list(own), {_jar_path(j) for j in own}
    for jar in (j.strip() for j in submitted.split(",")):
        if jar and _jar_path(jar) not in seen:
            jars.append(jar)
            seen.add(_jar_path(jar))
    return builder.config("spark.jars", ",".join(jars))


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
    "COMMIT_URLS_ENV",
    "COMMIT_URL_ENV",
    "DEFAULT_MASTER",
    "LOGSTORE_CLASS",
    "AuthorityConfig",
    "LogStoreJarMissing",
    "SparkUnavailable",
    "authority_conf",
    "commit_url_from_env",
    "commit_url_list",
    "get_spark",
    "governed",
    "ivy_dir",
    "java_missing",
    "logstore_jar",
    "spark_missing",
    "stop_spark",
]
