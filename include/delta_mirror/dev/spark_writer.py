"""A Spark job for a standalone cluster: appends, MERGEs and DELETEs into a Delta table on S3 (s3a),
every commit through the SQL authority (the delta-mirror LogStore and ``delta-mirror serve``).

Two halves, one file, so the command and the job cannot drift apart:

- ``submit_argv(...)`` (any Python, pyspark not imported) builds the ``spark-submit`` command:
  ``--master spark://HOST:PORT`` (the executors run on the cluster's workers), the Delta and s3a
  packages as ``get_spark`` resolves them (cached in ``.cache/ivy``), the LogStore jar and its
  settings with *every* commit-service replica's URL (comma-separated: the LogStore fails over), and
  this file as the application.
- Run by ``spark-submit`` (``main``), the job writes ``--rounds`` rounds of append → MERGE → DELETE
  and prints one JSON line: the versions it committed and the table's row count. The S3 keys come
  from the driver's environment (``AWS_ACCESS_KEY_ID`` ...) and go only into the JVM's Hadoop
  configuration (never a Spark setting: those show in the UI and event logs), as does the commit
  token (``DELTA_MIRROR_COMMIT_TOKEN``, read by the LogStore from the environment).

    python -m delta_mirror.dev.spark_writer submit --master spark://127.0.0.1:7077 \\
        --commit-url http://127.0.0.1:8787,http://127.0.0.1:8788 --table s3://lake/sales --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from delta_mirror.spark.session import (
    EXTRA_EXCLUDES,
    EXTRA_PACKAGES,
    LOGSTORE_CLASS,
    LOGSTORE_SCHEMES,
    PACKAGES_ENV,
    ivy_dir,
    logstore_jar,
)

# The environment the job reads its S3 options from (the names deltalake and object_store use)
S3_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_ALLOW_HTTP",
)


def delta_packages() -> str:
    """The ``--packages`` value: ``DELTA_MIRROR_SPARK_PACKAGES``, else what ``get_spark`` resolves
    (delta-spark's own coordinates for the installed version, plus ``EXTRA_PACKAGES``)."""
    configured = os.environ.get(PACKAGES_ENV)
    if configured:
        return configured
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    # a fresh builder (never the shared ``SparkSession.builder``) only records options: no JVM starts
    builder = configure_spark_with_delta_pip(SparkSession.Builder(), extra_packages=list(EXTRA_PACKAGES))
    return str(builder._options["spark.jars.packages"])


def spark_home() -> Path:
    """pyspark's package folder: it carries ``bin/spark-submit`` and the jars of the cluster too."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed: run `make venv`")
    return Path(spec.origin).parent


def submit_argv(
    master: str,
    table: str,
    commit_urls: Sequence[str],
    *,
    rounds: int = 1,
    rows: int = 100,
    roots: Sequence[str] = (),
    executor_memory: str = "512m",
    extra_conf: Mapping[str, str] | None = None,
) -> list[str]:
    """``spark-submit`` running this job on ``master`` against ``table`` (``s3://bucket/prefix``)."""
    if not master.startswith("spark://"):
        raise ValueError(f"master must be a standalone master URL (spark://host:port), got {master!r}")
    if not commit_urls:
        raise ValueError("at least one commit-service URL is needed (the job commits through it)")
    bucket_root = "s3a://" + table.split("://", 1)[1].split("/", 1)[0] + "/"
    conf: dict[str, str] = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.jars.ivy": str(ivy_dir()),
        "spark.jars.excludes": ",".join(EXTRA_EXCLUDES),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.executor.memory": executor_memory,
        "spark.executor.cores": "1",
        "spark.cores.max": "1",
        "spark.hadoop.delta.mirror.commit.url": ",".join(commit_urls),
        "spark.hadoop.delta.mirror.commit.roots": ",".join(roots or (bucket_root,)),
        **{f"spark.delta.logStore.{scheme}.impl": LOGSTORE_CLASS for scheme in LOGSTORE_SCHEMES},
        **(extra_conf or {}),
    }
    argv = [str(spark_home() / "bin" / "spark-submit"), "--master", master, "--deploy-mode", "client"]
    argv += ["--packages", delta_packages(), "--jars", str(logstore_jar())]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    argv += [str(Path(__file__).resolve()), "--table", table, "--rounds", str(rounds), "--rows", str(rows)]
    return argv


def submit_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for ``spark-submit``: the caller's, with this interpreter as PySpark's Python
    (driver and executors) and pyspark's folder as ``SPARK_HOME``."""
    env = dict(os.environ if environ is None else environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env["SPARK_HOME"] = str(spark_home())
    return env


def submit(
    master: str,
    table: str,
    commit_urls: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
    log: Path | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run the job on the cluster and return its JSON result; ``RuntimeError`` with the tail of its
    output when it fails (a missing jar, the master unreachable, a refused commit)."""
    argv = submit_argv(master, table, commit_urls, **kwargs)
    proc = subprocess.run(
        argv, env=submit_env(env), capture_output=True, text=True, timeout=timeout, check=False
    )
    if log is not None:
        log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    result = next((line for line in reversed(proc.stdout.splitlines()) if line.startswith("{")), None)
    if proc.returncode != 0 or result is None:
        tail = " | ".join(line for line in proc.stderr.splitlines()[-12:] if line.strip())
        raise RuntimeError(f"spark-submit to {master} failed (exit {proc.returncode}): {tail}")
    return dict(json.loads(result))


# -- the job (runs in the driver that spark-submit started) ---------------------------------------


def _write_rounds(spark: Any, uri: str, rounds: int, rows: int) -> list[dict[str, Any]]:
    """``rounds`` x (append ``rows`` new ids, MERGE: update a third and insert ``rows // 10``,
    DELETE the ids divisible by 7 of that round); then each commit's version and operation, as the
    table's history gives them (one read at the end, not a Spark job per commit)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    for r in range(rounds):
        base = r * rows * 2
        batch = spark.range(base, base + rows).select(
            F.col("id"), (F.col("id") % 10).cast("string").alias("city"), F.lit(r).alias("round")
        )
        batch.write.format("delta").mode("append").save(uri)
        updates = spark.range(base, base + rows + rows // 10).where(F.col("id") % 3 == 0)
        updates = updates.select(F.col("id"), F.lit("merged").alias("city"), F.lit(r).alias("round"))
        (
            DeltaTable.forPath(spark, uri)
            .alias("t")
            .merge(updates.alias("s"), "t.id = s.id")
            .whenMatchedUpdate(set={"city": "s.city"})
            .whenNotMatchedInsertAll()
            .execute()
        )
        DeltaTable.forPath(spark, uri).delete(f"id % 7 = 0 AND round = {r}")
    history = DeltaTable.forPath(spark, uri).history(3 * rounds).select("version", "operation").collect()
    return [{"op": str(h["operation"]), "version": int(h["version"])} for h in sorted(history)]


def run_job(table: str, rounds: int, rows: int) -> dict[str, Any]:
    """The job body: the session spark-submit configured, the bucket's s3a settings from the
    environment, the writes; the result as a dict (printed as one JSON line by ``main``)."""
    from pyspark.sql import SparkSession

    from delta_mirror.spark.s3a import configure_s3a

    started = time.monotonic()
    spark = SparkSession.builder.appName("delta-mirror-spark-writer").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        options = {key: os.environ[key] for key in S3_ENV if os.environ.get(key)}
        uri = configure_s3a(spark, table, options)
        operations = _write_rounds(spark, uri, rounds, rows)
        count = spark.read.format("delta").load(uri).count()
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        return {
            "table": uri,
            "master": spark.sparkContext.master,
            "executors": executors,
            "operations": operations,
            "versions": [op["version"] for op in operations],
            "rows": count,
            "seconds": round(time.monotonic() - started, 2),
        }
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="delta_mirror.dev.spark_writer", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    submit_p = sub.add_parser("submit", help="spark-submit this job to a standalone master")
    submit_p.add_argument("--master", required=True, help="spark://HOST:PORT")
    submit_p.add_argument(
        "--commit-url",
        help="commit-service URL(s), comma-separated (default: DELTA_MIRROR_COMMIT_URL, the same list)",
    )
    for p in (parser, submit_p):
        p.add_argument("--table", help="s3://bucket/prefix of the table")
        p.add_argument("--rounds", type=int, default=1, help="append/MERGE/DELETE rounds (3 commits each)")
        p.add_argument("--rows", type=int, default=100, help="rows appended per round")
    args = parser.parse_args(argv)
    if not args.table:
        parser.error("--table is required")
    if args.rounds < 1 or args.rows < 1:
        parser.error("--rounds and --rows must be at least 1")
    if args.command == "submit":
        from delta_mirror.errors import PermanentError
        from delta_mirror.spark.session import COMMIT_URL_ENV, commit_url_from_env, commit_url_list

        try:
            listed = commit_url_list(args.commit_url, "--commit-url") if args.commit_url else None
            urls = listed or (commit_url_from_env() or "").split(",")
        except PermanentError as exc:
            parser.error(exc.message)
        if not any(urls):
            parser.error(f"--commit-url or {COMMIT_URL_ENV} is required (every commit-service replica's URL)")
        try:
            result = submit(args.master, args.table, urls, rounds=args.rounds, rows=args.rows)
        except (RuntimeError, ValueError) as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 1
    else:
        result = run_job(args.table, args.rounds, args.rows)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


__all__ = ["delta_packages", "main", "run_job", "spark_home", "submit", "submit_argv", "submit_env"]


if __name__ == "__main__":
    sys.exit(main())
