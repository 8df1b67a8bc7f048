"""The PySpark ingest pipeline: source files → Parquet data files → a commit through the store.

Every test uses real Spark (the shared session), the real store (SQLite, and PostgreSQL for the
round trip), the real publisher and real readers: after publishing, Delta-Spark and deltalake read
exactly the ingested rows, and the stats in each ``add`` are checked against the data file.
"""

from __future__ import annotations

import csv
import json
import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from delta_mirror.errors import CommitConflictError, DataError
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import validate_table
from delta_mirror.spark.ingest import ingest, main
from delta_mirror.store import SqlStore

DDL = "event_id BIGINT, user STRING, country STRING, ts TIMESTAMP, amount DECIMAL(12,2), score DOUBLE, day DATE, ok BOOLEAN"
ARROW = pa.schema(
    [
        ("event_id", pa.int64()),
        ("user", pa.string()),
        ("country", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("amount", pa.decimal128(12, 2)),
        ("score", pa.float64()),
        ("day", pa.date32()),
        ("ok", pa.bool_()),
    ]
)
COUNTRIES = ["PT", "US", "a b", "100%", "São Paulo", "x/y", "日本", None]
USERS = ["ana", "Zoë 🚀", 'quote "q", comma', "a-very-long-user-name-well-over-thirty-two-characters", "bo"]
CSV_OPTIONS = {"escape": '"'}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CENT = Decimal("0.01")


def events(first_id: int, n: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        ts = datetime(2024, 3, 1, tzinfo=UTC) + timedelta(microseconds=rnd.randrange(10**12))
        out.append(
            {
                "event_id": first_id + i,
                "user": None if i % 11 == 0 else rnd.choice(USERS) + str(rnd.randrange(3)),
                "country": COUNTRIES[i % len(COUNTRIES)],
                "ts": None if i % 13 == 0 else ts,
                "amount": None
                if i % 7 == 0
                else (Decimal(rnd.randrange(-(10**6), 10**6)) / 100).quantize(CENT),
                "score": None if i % 5 == 0 else rnd.uniform(-1e6, 1e6),
                "day": None if i % 17 == 0 else date(2024, 1, 1) + timedelta(days=rnd.randrange(400)),
                "ok": None if i % 3 == 0 else bool(i % 2),
            }
        )
    return out


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(ARROW.names)
        for r in rows:
            w.writerow(
                [
                    "" if r[c] is None else r[c].isoformat().replace("+00:00", "Z") if c == "ts" else r[c]
                    for c in ARROW.names
                ]
            )
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows, schema=ARROW), path)
    return path


def _micros(ts: datetime | None) -> int | None:
    return None if ts is None else (ts - EPOCH) // timedelta(microseconds=1)


def normalized(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows as comparable tuples: timestamps in microseconds, decimals and dates as text."""
    out = []
    for r in rows:
        ts = r["ts"]
        if isinstance(ts, datetime) and ts.tzinfo is None:
            ts = ts.replace(tzinfo=UTC)
        out.append(
            (
                r["event_id"],
                r["user"],
                r["country"],
                _micros(ts),
                None if r["amount"] is None else str(r["amount"]),
                r["score"],
                None if r["day"] is None else r["day"].isoformat(),
                r["ok"],
            )
        )
    return sorted(out, key=lambda t: t[0])


def spark_rows(spark: Any, location: Path) -> list[tuple[Any, ...]]:
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(str(location))
    rows = df.select(
        "event_id",
        "user",
        "country",
        F.unix_micros("ts").alias("ts"),
        F.col("amount").cast("string").alias("amount"),
        "score",
        F.col("day").cast("string").alias("day"),
        "ok",
    ).collect()
    return sorted((tuple(r) for r in rows), key=lambda t: t[0])


def deltalake_rows(location: Path) -> list[tuple[Any, ...]]:
    from deltalake import DeltaTable

    return normalized(DeltaTable(location.as_uri()).to_pyarrow_table().to_pylist())


def skipping_probes(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """Predicates on the edges of the stats (readers skip files by them) and the rows they match.

    The latest timestamp has microseconds (stats keep milliseconds), a long user name is longer than
    the 32 characters string stats keep, and the extreme amounts are the min/max stats themselves.
    """
    latest = max((r for r in rows if r["ts"] is not None), key=lambda r: r["ts"])
    assert latest["ts"].microsecond % 1000
    long_user = next(r["user"] for r in rows if r["user"] and len(r["user"]) > 32)
    amounts = [r["amount"] for r in rows if r["amount"] is not None]
    ts_text = latest["ts"].strftime("%Y-%m-%d %H:%M:%S.%f")
    return [
        (f"ts = TIMESTAMP '{ts_text}'", sum(r["ts"] == latest["ts"] for r in rows)),
        (f"ts >= TIMESTAMP '{ts_text}'", sum(r["ts"] is not None and r["ts"] >= latest["ts"] for r in rows)),
        (f"user = '{long_user}'", sum(r["user"] == long_user for r in rows)),
        (f"user >= '{long_user}'", sum(r["user"] is not None and r["user"] >= long_user for r in rows)),
        (f"amount = {max(amounts)}", amounts.count(max(amounts))),
        (f"amount <= {min(amounts)}", amounts.count(min(amounts))),
        ("country = '100%'", sum(r["country"] == "100%" for r in rows)),
        ("country IS NULL", sum(r["country"] is None for r in rows)),
    ]


def deltalake_count(location: Path, predicate: str) -> int:
    """Rows matching ``predicate`` as deltalake's query engine counts them (it prunes files by stats)."""
    from deltalake import DeltaTable, QueryBuilder

    sql = '"user"' + predicate[4:] if predicate.startswith("user") else predicate  # a keyword in DataFusion
    result = (
        QueryBuilder()
        .register("t", DeltaTable(location.as_uri()))
        .execute(f"select count(*) from t where {sql}")
    )
    return int(pa.table(result.read_all()).column(0)[0].as_py())


def adds_of(store: SqlStore, table: str, version: int) -> list[dict[str, Any]]:
    info = store.get_table(table)
    lines = store.commit_lines(info.id, version, version)[version]
    return [json.loads(line)["add"] for line in lines if line.startswith('{"add"')]


def _ms(ts: datetime, up: bool) -> str:
    micros = _micros(ts)
    assert micros is not None
    millis = -(-micros // 1000) if up else micros // 1000
    moment = EPOCH + timedelta(milliseconds=millis)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{millis % 1000:03d}Z"


def check_stats(root: Path, add: dict[str, Any]) -> int:
    """The add's stats against its data file: exact counts, and the bounds the writer promises."""
    data = pq.read_table(root / unquote(add["path"]))
    stats = json.loads(add["stats"], parse_float=Decimal)
    assert stats["numRecords"] == data.num_rows > 0
    assert set(stats["nullCount"]) == set(data.column_names)
    for name in data.column_names:
        col = data[name]
        assert stats["nullCount"][name] == col.null_count, name
        lo, hi = stats["minValues"].get(name), stats["maxValues"].get(name)
        if col.null_count == len(col) or name == "ok":
            assert lo is None and hi is None, name
            continue
        mm = pc.min_max(col)
        low, high = mm["min"].as_py(), mm["max"].as_py()
        if name == "ts":
            assert (lo, hi) == (_ms(low, up=False), _ms(high, up=True))
        elif name == "user":
            assert lo == low[:32]
            assert hi == (high if len(high) <= 32 else None)
        elif name == "day":
            assert (lo, hi) == (low.isoformat(), high.isoformat())
        elif name == "score":
            assert (float(lo), float(hi)) == (low, high)
        else:
            assert (lo, hi) == (low, high), name
    return int(data.num_rows)


def test_ingest_creates_appends_and_overwrites_and_readers_get_exactly_the_rows(
    spark: Any, store: SqlStore, tmp_path: Path
) -> None:
    root = tmp_path / "events"
    first, second, third = events(0, 300, 1), events(1000, 200, 2), events(5000, 60, 3)

    created = ingest(
        spark,
        store,
        "events",
        str(write_csv(tmp_path / "a.csv", first)),
        format="csv",
        schema=DDL,
        options=CSV_OPTIONS,
        location=str(root),
        partition_by=["country"],
    )
    appended = ingest(
        spark, store, "events", str(write_parquet(tmp_path / "b.parquet", second)), format="parquet"
    )

    assert (created.version, created.created, created.rows) == (0, True, 300)
    assert (appended.version, appended.created, appended.rows, appended.attempts) == (1, False, 200, 1)
    assert created.files == len(COUNTRIES)  # one file per partition (null included)
    adds = adds_of(store, "events", 0) + adds_of(store, "events", 1)
    assert sum(check_stats(root, a) for a in adds) == 500
    values = {a["partitionValues"]["country"] for a in adds}
    assert values == set(COUNTRIES)
    paths = {a["partitionValues"]["country"]: a["path"] for a in adds_of(store, "events", 0)}
    assert paths[None].startswith("country=__HIVE_DEFAULT_PARTITION__/part-")
    assert paths["100%"].startswith("country=100%2525/")  # Hive escaping, then URI encoding (as Delta-Spark)
    assert paths["x/y"].startswith("country=x%252Fy/") and paths["a b"].startswith("country=a%20b/")
    assert not (root / "_delta_mirror_staging").exists()

    Publisher(store).publish("events")
    expected = normalized(first + second)
    assert spark_rows(spark, root) == expected
    assert deltalake_rows(root) == expected
    report = validate_table(store, "events")
    assert report.ok, report.problems
    for predicate, count in skipping_probes(first + second):
        assert spark.read.format("delta").load(str(root)).where(predicate).count() == count, predicate
        assert deltalake_count(root, predicate) == count, predicate

    replaced = ingest(
        spark,
        store,
        "events",
        str(write_parquet(tmp_path / "c.parquet", third)),
        format="parquet",
        mode="overwrite",
    )
    assert (replaced.version, replaced.removed_files, replaced.rows) == (2, len(adds), 60)
    assert sum(check_stats(root, a) for a in adds_of(store, "events", 2)) == 60
    Publisher(store).publish("events")
    assert spark_rows(spark, root) == normalized(third)
    assert deltalake_rows(root) == normalized(third)
    spark_at_1 = spark.read.format("delta").option("versionAsOf", 1).load(str(root)).count()
    assert spark_at_1 == 500  # time travel still sees the appended version
    info = store.get_table("events")
    ops = [
        json.loads(store.commit_lines(info.id, v, v)[v][0])["commitInfo"]["operationParameters"]["mode"]
        for v in range(3)
    ]
    assert ops == ["ErrorIfExists", "Append", "Overwrite"]
    if store.engine.dialect.name == "sqlite":  # the same log either way: Delta-Spark checks it once
        report = validate_table(store, "events", reader="spark", spark=spark)
        assert report.ok, report.problems


def _sqlite(tmp_path: Path) -> SqlStore:
    s = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    s.init()
    return s


def _small(spark: Any, first_id: int, n: int) -> Any:
    """A DataFrame of ``events(first_id, n, seed=first_id)``."""
    rows = [tuple(r[c] for c in ARROW.names) for r in events(first_id, n, first_id)]
    return spark.createDataFrame(rows, DDL)


def _data_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


def _active(store: SqlStore, table: str) -> set[str]:
    info = store.get_table(table)
    latest = store.latest_version(info.id)
    assert latest is not None
    return {unquote(f.path) for f in store.active_files(info.id, latest)}


def test_a_racing_blind_append_is_rebased_onto_the_winner(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, root = _sqlite(tmp_path), tmp_path / "t"
    rows = events(0, 40, 0)
    ingest(spark, store, "t", df=_small(spark, 0, 40), location=str(root), partition_by=["country"])
    real_commit = store.commit
    raced: list[int] = []

    def commit_after_a_rival(name: str, actions: Any, **kwargs: Any) -> int:
        if not raced:  # another writer commits between our read of the table and our commit
            raced.append(-1)
            raced[0] = ingest(spark, store, "t", df=_small(spark, 100, 30)).version or 0
        return real_commit(name, actions, **kwargs)

    monkeypatch.setattr(store, "commit", commit_after_a_rival)
    result = ingest(spark, store, "t", df=_small(spark, 200, 20))

    assert raced == [1]
    assert (result.version, result.attempts) == (2, 2)
    info = store.get_table("t")
    commit_info = json.loads(store.commit_lines(info.id, 2, 2)[2][0])["commitInfo"]
    assert commit_info["readVersion"] == 1 and commit_info["isBlindAppend"] is True
    Publisher(store).publish("t")
    expected = normalized(rows + events(100, 30, 100) + events(200, 20, 200))
    assert spark_rows(spark, root) == expected
    assert _data_files(root) == _active(store, "t")
    assert validate_table(store, "t").ok


@pytest.mark.parametrize("rival", ["append", "metadata"])
def test_a_race_that_cannot_be_rebased_is_refused_and_its_files_removed(
    rival: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An overwrite read the whole table; an append cannot follow a schema change."""
    store, root = _sqlite(tmp_path), tmp_path / "t"
    ingest(spark, store, "t", df=_small(spark, 0, 40), location=str(root), partition_by=["country"])
    real_commit = store.commit
    info = store.get_table("t")

    def commit_after_a_rival(name: str, actions: Any, **kwargs: Any) -> int:
        monkeypatch.setattr(store, "commit", real_commit)
        if rival == "append":
            ingest(spark, store, "t", df=_small(spark, 100, 10))
        else:
            meta = json.loads(store.snapshot(info.id, 0).metadata)["metaData"]
            schema = json.loads(meta["schemaString"])
            schema["fields"].append({"name": "extra", "type": "string", "nullable": True, "metadata": {}})
            real_commit(name, [("metaData", {**meta, "schemaString": json.dumps(schema)})])
        return real_commit(name, actions, **kwargs)

    monkeypatch.setattr(store, "commit", commit_after_a_rival)
    with pytest.raises(CommitConflictError):
        ingest(
            spark, store, "t", df=_small(spark, 200, 20), mode="overwrite" if rival == "append" else "append"
        )

    assert store.latest_version(info.id) == 1
    assert _data_files(root) == _active(store, "t")  # the refused commit's files are gone


def test_a_source_that_does_not_match_the_table_is_refused_before_writing(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    store, root = _sqlite(tmp_path), tmp_path / "t"
    ingest(spark, store, "t", df=_small(spark, 0, 10), location=str(root))
    before = _data_files(root)
    wrong = _small(spark, 10, 5).withColumnRenamed("score", "points")
    with pytest.raises(DataError, match=r"missing column\(s\) \['score'\]; unknown column\(s\) \['points'\]"):
        ingest(spark, store, "t", df=wrong)
    narrower = _small(spark, 10, 5).withColumn("event_id", F.col("event_id").cast("int"))
    assert ingest(spark, store, "t", df=narrower).version == 1  # int widens to the table's long
    with pytest.raises(DataError, match="partitioned by"):
        ingest(spark, store, "t", df=_small(spark, 20, 5), partition_by=["country"])
    assert before < _data_files(root) == _active(store, "t")  # refused ingests wrote nothing


def test_a_retried_ingest_with_the_same_app_version_is_skipped(spark: Any, tmp_path: Path) -> None:
    store, root = _sqlite(tmp_path), tmp_path / "t"
    first = ingest(
        spark, store, "t", df=_small(spark, 0, 10), location=str(root), app_id="job", app_version=7
    )
    again = ingest(spark, store, "t", df=_small(spark, 0, 10), app_id="job", app_version=7)
    later = ingest(spark, store, "t", df=_small(spark, 10, 10), app_id="job", app_version=8)
    assert (first.version, again.skipped, again.version, later.version) == (0, True, None, 1)
    Publisher(store).publish("t")
    assert spark_rows(spark, root) == normalized(events(0, 10, 0) + events(10, 10, 10))


def test_the_job_entry_point_ingests_a_csv_file(spark: Any, tmp_path: Path, capsys: Any) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    SqlStore(url).init()
    source = write_csv(tmp_path / "e.csv", events(0, 25, 5))
    argv = ["--table", "cli", "--source", str(source), "--location", str(tmp_path / "cli"), "--store", url]
    code = main([*argv, "--schema", DDL, "--option", 'escape="', "--partition-by", "country"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["version"], out["rows"], out["created"]) == (0, 25, True)
    # a second run with a source the table cannot take exits with the DATA code
    assert main(["--table", "cli", "--source", str(source), "--store", url, "--option", 'escape="']) == 4
