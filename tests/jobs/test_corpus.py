"""The corpus: every real table is imported, republished elsewhere and read back identically.

For each table of category ok / edge / log-ok/data-unreadable: import into a fresh store, publish
to a fresh location (data files copied beside it), then check that every source commit comes back
with the same actions in the same order (byte-identical for Delta-Spark writers), that deltalake sees
the same version, file set and row count, that every published checkpoint alone rebuilds the file
set at its version, and that ``validate`` is clean. ``negative`` tables must be refused.
deltalake also sees the same protocol and schema at every published version.

The local pass reads every published table with three more readers: DuckDB's delta extension and
Delta-Spark (the published table against the same reader's view of the source: version, schema,
file set, row count) and delta-kernel-java (``validate --reader kernel-java``: every version against
the store, in one JVM). A reader is skipped for a table only when it cannot read the source either;
the reason is recorded (``reader_skips`` in the test's properties). Rows are not compared where
the reader cannot count the source's rows either (data files absent from the corpus).

Each table also goes through PostgreSQL + S3, MySQL/MariaDB + a local folder and DuckDB + a local
folder, checked with deltalake only (the published bytes are the source's on every store).
"""

from __future__ import annotations

import csv
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder

from delta_mirror.delta.log_path import LogFileKind, parse_log_file
from delta_mirror.errors import MirrorError
from delta_mirror.jobs.importer import import_table
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import validate_table
from delta_mirror.jobs.validate.duckdb_reader import DuckDBView, connect, read_with_duckdb
from delta_mirror.jobs.validate.spark_reader import input_files
from delta_mirror.storage import local_path, normalize_location, open_store, storage_options_for
from delta_mirror.store import SqlStore

# Tables refused for a documented, protocol-level reason (docs/compatibility.md: "Unsupported tables").
REFUSED = {
    "kernel-rs/uc-catalog_managed_0": "catalogManaged",
    "delta-rs/simple_table_features": "blahabl",
    "kernel-rs/crc-malformed": "not a Delta table",
    # version 0's metaData has no schemaString: no reader can reconstruct it (docs/compatibility.md, the rule for
    # invalid logs); deltalake refuses to load that version of the source too
    "delta-rs/delta-live-table": "schemaString",
}
HEAVY = {"kernel-rs/300k-add-files-100-col-partitioned"}


def _index() -> list[dict[str, str]]:
    from support.services import corpus_path

    path = corpus_path() / "INDEX.tsv"
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


ROWS = _index()
IDS = [r["path"] for r in ROWS]


def _copy_data(src: Path, dst: Path) -> None:
    for item in src.rglob("*"):
        rel = item.relative_to(src)
        if rel.parts[0] == "_delta_log" or item.is_dir():
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(item, target)


def _upload_data(src: Path, bucket: str, prefix: str, client: Any) -> None:
    for item in src.rglob("*"):
        rel = item.relative_to(src)
        if rel.parts[0] == "_delta_log" or item.is_dir():
            continue
        client.upload_file(str(item), bucket, f"{prefix}/{rel.as_posix()}")


def _lines(data: bytes) -> list[Any]:
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def _engine(data: bytes) -> str:
    # only the lines that can hold a commitInfo are parsed (a 100k-line commit has one)
    for line in data.decode("utf-8").splitlines():
        if '"commitInfo"' in line and "commitInfo" in (action := json.loads(line)):
            return str(action["commitInfo"].get("engineInfo", ""))
    return ""


def _as_jackson_writes(data: bytes) -> bool:
    """True when the file is exactly what Jackson writes (compact, one action per line, final newline).

    A few corpus files were edited by hand after Spark wrote them (spaces after ':' or ','); for those
    only the actions, not the bytes, can be compared.
    """
    lines = data.decode("utf-8").split("\n")
    if lines[-1] != "":
        return False
    return all(
        json.dumps(json.loads(line), separators=(",", ":"), ensure_ascii=False) == line for line in lines[:-1]
    )


def _open_or_none(path: str, version: int | None = None) -> DeltaTable | None:
    try:
        return DeltaTable(path, version=version)
    except Exception:
        return None


def _add_paths(dt: DeltaTable) -> set[str]:
    return set(pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist())


def _row_count(dt: DeltaTable) -> int:
    result = QueryBuilder().register("t", dt).execute("select count(*) as n from t").read_all()
    return int(pa.table(result).column("n")[0].as_py())


def _checkpoint_adds(objects: Any, version: int) -> set[tuple[str, str]] | None:
    """(path, dv) of the adds a published checkpoint alone describes (following V2 sidecars)."""
    names = [m.path for m in objects.list("_delta_log")]
    parts: list[str] = []
    for name in names:
        parsed = parse_log_file(name.rsplit("/", 1)[-1])
        if parsed and parsed.is_checkpoint and parsed.version == version and "/_sidecars/" not in name:
            parts.append(name)
    if not parts:
        return None
    out: set[tuple[str, str]] = set()
    for name in sorted(parts):
        data = objects.get(name)
        assert data is not None
        if name.endswith(".json"):
            rows = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        else:
            rows = [
                {k: v for k, v in r.items() if v is not None}
                for r in pq.read_table(pa.BufferReader(data)).to_pylist()
            ]
        for row in rows:
            if "sidecar" in row:
                side = objects.get(f"_delta_log/_sidecars/{row['sidecar']['path']}")
                assert side is not None, f"sidecar {row['sidecar']['path']} missing"
                for srow in pq.read_table(pa.BufferReader(side)).to_pylist():
                    if srow.get("add"):
                        out.add((srow["add"]["path"], _dv_key(srow["add"].get("deletionVector"))))
            if row.get("add"):
                out.add((row["add"]["path"], _dv_key(row["add"].get("deletionVector"))))
    return out


def _dv_key(dv: Any) -> str:
    if not dv:
        return "null"  # json.dumps(None): most adds (600,000 of them on the 300k-file table)
    return json.dumps({k: v for k, v in dv.items() if v is not None} if dv else None, sort_keys=True)


def _store_adds(store: SqlStore, table_id: int, version: int) -> set[tuple[str, str]]:
    out = set()
    for batch in store.iter_active_add_lines(table_id, version):
        for line in batch:
            add = json.loads(line)["add"]
            out.add((add["path"], _dv_key(add.get("deletionVector"))))
    return out


def _protocol(dt: DeltaTable) -> tuple[Any, ...]:
    p = dt.protocol()
    return (
        p.min_reader_version,
        p.min_writer_version,
        sorted(p.reader_features or []),
        sorted(p.writer_features or []),
    )


def _same_protocol_and_schema_at_every_version(
    name: str, source: str, location: str, opts: dict[str, str], result: Any
) -> None:
    """deltalake loads each published version of both tables (incrementally): same protocol, schema."""
    first, last = result.start_version, result.end_version
    src = _open_or_none(source, first)
    dst = DeltaTable(location, version=first, storage_options=opts)
    for version in range(first, last + 1):
        if version > first:
            try:
                assert src is not None
                src.load_as_version(version)
            except Exception:
                src = _open_or_none(source, version)
            dst.load_as_version(version)
        if src is None:
            continue  # deltalake cannot load this version of the source either
        assert _protocol(dst) == _protocol(src), f"{name} v{version}: protocol differs"
        assert json.loads(dst.schema().to_json()) == json.loads(src.schema().to_json()), (
            f"{name} v{version}: schema differs"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _read_pair(
    read: Any, name: str, reader: str, source: Path, published: Path, version: int, skips: list[str]
) -> tuple[Any, Any] | None:
    """``read(folder, version, count)`` of the published table and of the source (rows counted when
    the reader can count both); ``None``, with the reason in ``skips``, when it cannot read the source."""
    error = ""
    for count in (True, False):
        try:
            return read(published, version, count), read(source, version, count)
        except Exception as exc:
            error = _first_line(exc)
    try:
        read(source, version, False)
    except Exception as exc:
        skips.append(f"{reader}: cannot read the source either ({_first_line(exc)})")
        return None
    raise AssertionError(
        f"{name}: {reader} reads the source at v{version} but not the published copy: {error}"
    )


def _duckdb_matches_the_source(
    name: str, source: Path, published: Path, version: int, skips: list[str]
) -> DuckDBView | None:
    """DuckDB (delta-kernel-rs): the published table at ``version`` is the source's (one shared database).

    Returns DuckDB's view of the source (the baseline Delta-Spark is compared with), or ``None``."""
    con = connect()

    def read(folder: Path, v: int, count: bool) -> DuckDBView:
        return read_with_duckdb(con, str(folder), v, count=count)

    pair = _read_pair(read, name, "duckdb", source, published, version, skips)
    if pair is None:
        return None
    published_view, source_view = pair
    assert isinstance(source_view, DuckDBView)
    assert published_view == source_view, (
        f"{name}: DuckDB sees {published_view} published, {source_view} in the source"
    )
    return source_view


_SPARK: list[Any] = []


def _spark() -> Any:
    """The shared SparkSession (tests/support/spark.py), started on first use; None without pyspark."""
    if not _SPARK:
        try:
            from support.spark import shared_spark

            _SPARK.append(shared_spark())
        except ImportError:
            _SPARK.append(None)
    return _SPARK[0]


def _spark_view(spark: Any, folder: Path, v: int, count: bool) -> tuple[Any, ...]:
    """Delta-Spark's (schema, files relative to the root, rows or None) of ``folder`` at ``v``."""
    df = spark.read.format("delta").option("versionAsOf", v).load(str(folder))
    roots = (folder.as_uri().rstrip("/") + "/", f"file:{folder}/")
    files = set()
    for f in input_files(df):
        for root in roots:
            if f.startswith(root):
                f = f[len(root) :]
                break
        files.add(unquote(f))
    return (json.loads(df.schema.json()), frozenset(files), df.count() if count else None)


def _spark_agrees_with_the_baseline(
    spark: Any, name: str, source: Path, published: Path, version: int, skips: list[str], baseline: DuckDBView
) -> bool:
    """Spark's published files and rows are DuckDB's source view, and its schema Spark's source schema.

    Rows are counted only where DuckDB counted them: where it could not read the data (the corpus's
    log-only tables), a failing count by Spark would cost a job over every file, for nothing."""
    try:
        found = _spark_view(spark, published, version, baseline.rows is not None)
    except Exception:
        return False  # decided by Spark's own reading of both
    if (found[1], found[2]) != (baseline.files, baseline.rows):
        return False
    try:
        df = spark.read.format("delta").option("versionAsOf", version).load(str(source))
        source_schema = json.loads(df.schema.json())
    except Exception as exc:  # the published copy is readable; its files and rows were checked
        skips.append(f"spark: cannot read the source's schema ({_first_line(exc)})")
        return True
    assert found[0] == source_schema, f"{name}: Delta-Spark sees another schema published"
    return True


def _spark_matches_the_source(
    name: str,
    source: Path,
    published: Path,
    version: int,
    skips: list[str],
    baseline: DuckDBView | None,
) -> None:
    """Delta-Spark: schema, file set and rows of the published table at ``version`` are the source's.

    Spark reads the published copy in full; the source's files and rows are DuckDB's ``baseline``
    (already read), and Spark reads only the source's schema. Spark reads the source in full only
    where there is no baseline or where its published view differs from it: then Spark's own view
    of the source decides, so a reader's quirk is not taken for a mirror problem. About half the
    cost of reading both in full (each read lists the files, loads the snapshot, counts)."""
    spark = _spark()
    if spark is None:
        skips.append("spark: pyspark is not installed")
        return

    def read(folder: Path, v: int, count: bool) -> tuple[Any, ...]:
        return _spark_view(spark, folder, v, count)

    if name in SPARK_READS_COMPACTED:
        _schema, files, rows = read(published, version, True)
        duckdb_source = read_with_duckdb(connect(), str(source), version)
        assert (files, rows) == (duckdb_source.files, duckdb_source.rows), (
            f"{name}: Delta-Spark vs DuckDB's source view"
        )
        skips.append(
            "spark: compared with DuckDB's view of the source (Spark trusts its .compacted.json files)"
        )
        return
    if baseline is not None and _spark_agrees_with_the_baseline(
        spark, name, source, published, version, skips, baseline
    ):
        return
    pair = _read_pair(read, name, "spark", source, published, version, skips)
    if pair is not None:
        assert pair[0] == pair[1], f"{name}: Delta-Spark sees {pair[0]} published, {pair[1]} in the source"


def location_dir(store: SqlStore, table: str) -> Path:
    folder = local_path(normalize_location(store.get_table(table).location))
    assert folder is not None
    return folder


# Delta-Spark trusts a log's .compacted.json files; in this source they describe other files than its
# commits (the kernel-rs fixture), and the mirror publishes no compacted files: DuckDB's view of the
# source is the baseline for Spark here.
SPARK_READS_COMPACTED = {"kernel-rs/compacted-log-files-table"}


def _kernel_java_matches_the_store(
    store: SqlStore, table: str, source: Path, version: int, skips: list[str]
) -> None:
    """delta-kernel-java (one JVM for every version): the published table against the store."""
    from delta_mirror.jobs.validate import kernel_java

    if kernel_java.java_binary() is None or kernel_java.kernel_jar() is None:
        skips.append("kernel-java: no java or no reader jar (make kernel-jar)")
        return
    report = validate_table(store, table, reader="kernel-java")
    if report.limitations or any(p.kind == "reader_error" for p in report.problems):
        try:
            kernel_java.read_with_kernel_java(str(source), version, count_rows=False)
            failures = [p.message for p in report.problems] + [lim.message for lim in report.limitations]
            if any("cannot read the data files" in m for m in failures):  # the data of the source, then
                kernel_java.read_with_kernel_java(str(source), version)
        except kernel_java.ReaderError as exc:
            skips.append(f"kernel-java: cannot read the source either ({exc.message[:200]})")
            return
    disagree = [p for p in report.problems if p.kind in ("reader_rows", "reader_files")]
    if disagree and len(disagree) == len(report.problems) and not report.limitations:
        # The kernel's own reading of the source, at those versions: the same view is its quirk, not ours.
        seen: dict[int, str] = {}
        for p in disagree:
            assert p.version is not None, p.message  # reader_rows / reader_files name their version
            seen[p.version] = p.message
        published = kernel_java.read_versions_with_kernel_java(str(location_dir(store, table)), sorted(seen))
        original = kernel_java.read_versions_with_kernel_java(str(source), sorted(seen))
        for v in seen:
            pub, src = published[v], original[v]
            assert not isinstance(pub, Exception) and not isinstance(src, Exception), seen[v]
            assert (pub.files, pub.row_count) == (src.files, src.row_count), seen[v]
        skips.append(
            f"kernel-java: reads the source the same way, unlike its stats ({next(iter(seen.values()))[:200]})"
        )
        return
    assert not report.problems and not report.limitations, [
        f"{p.kind} v{p.version}: {p.message}" for p in report.problems
    ] + [f"limitation v{lim.version}: {lim.message}" for lim in report.limitations]


def _check_table(
    row: dict[str, str],
    corpus: Path,
    store_url: str,
    location: str,
    opts: dict[str, str],
    upload: Any,
    skips: list[str] | None = None,
) -> None:
    name = row["path"]
    source = corpus / name
    table = name.replace("/", "__").replace("-", "_")
    store = SqlStore(store_url)
    store.init()
    if name in REFUSED:
        with pytest.raises(MirrorError) as err:
            import_table(store, str(source), name=table, location=location)
        assert REFUSED[name].lower() in err.value.message.lower(), err.value.message
        return
    upload(source)
    result = import_table(store, str(source), name=table, location=location)
    info = store.get_table(table)
    published = Publisher(store).publish(table)
    assert published.last_published == result.end_version
    published_dir = local_path(normalize_location(location))
    local_pass = skips is not None and published_dir is not None
    # The local pass's delta-kernel-java check (its own JVM, its own store connection) runs beside
    # every other check of the table: on 2 cores it mostly waits on a JVM while they read.
    kernel_skips: list[str] = []
    pool = ThreadPoolExecutor(1, thread_name_prefix="kernel-java") if local_pass else None
    kernel = (
        pool.submit(_kernel_java_beside, store_url, table, source, result.end_version, kernel_skips)
        if pool is not None
        else None
    )
    try:
        _check_published(name, row, store, info, result, source, location, opts, skips, published_dir)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    if kernel is not None:
        kernel.result()  # its assertion, if any, fails the test here
        assert skips is not None
        skips.extend(kernel_skips)
    store.close()


def _kernel_java_beside(store_url: str, table: str, source: Path, version: int, skips: list[str]) -> None:
    store = SqlStore(store_url)
    try:
        _kernel_java_matches_the_store(store, table, source, version, skips)
    finally:
        store.close()


def _check_published(
    name: str,
    row: dict[str, str],
    store: SqlStore,
    info: Any,
    result: Any,
    source: Path,
    location: str,
    opts: dict[str, str],
    skips: list[str] | None,
    published_dir: Path | None,
) -> None:
    """Commits, deltalake, checkpoints, ``validate``; on the local pass DuckDB and Delta-Spark too."""
    table = info.name

    objects = open_store(location)
    src_objects = open_store(str(source))
    # Every source commit of the segment comes back with the same actions in the same order.
    for version in range(result.start_version, result.end_version + 1):
        fname = f"_delta_log/{version:020d}.json"
        original = src_objects.get(fname)
        if original is None:
            assert version == result.base_checkpoint_version
            continue
        mirrored = objects.get(fname)
        assert mirrored is not None, f"{fname} not published"
        # the same bytes are the same actions; otherwise every line is compared parsed
        assert mirrored == original or _lines(mirrored) == _lines(original), (
            f"{name} v{version}: actions differ"
        )
        if _engine(original).startswith("Apache-Spark") and _as_jackson_writes(original):
            assert mirrored == original, f"{name} v{version}: not byte-identical to Delta-Spark's file"
    # deltalake sees the same version, files and rows (where it can read the source at all).
    src_dt = _open_or_none(str(source))
    if src_dt is not None:
        dst_dt = DeltaTable(location, storage_options=opts)
        assert dst_dt.version() == src_dt.version()
        assert _add_paths(dst_dt) == _add_paths(src_dt)
        if row["category"] == "ok":
            assert _row_count(dst_dt) == _row_count(src_dt)
        _same_protocol_and_schema_at_every_version(name, str(source), location, opts, result)
    # Every published checkpoint alone rebuilds the file set at its version.
    for status in store.status_rows(info.id, artifact="checkpoint", states=("SUCCESS",)):
        adds = _checkpoint_adds(objects, status.version)
        assert adds is not None, f"checkpoint {status.version} missing"
        assert adds == _store_adds(store, info.id, status.version), (
            f"checkpoint {status.version} file set differs"
        )
    report = validate_table(store, table)
    # deltalake's own limits (it cannot read the source either) are not mirror problems.
    problems = [
        p
        for p in report.problems
        if not (p.kind == "reader_error" and _open_or_none(str(source), p.version) is None)
    ]
    assert not problems, [f"{p.kind} v{p.version}: {p.message}" for p in problems]
    if skips is not None and published_dir is not None:  # the local pass: two more readers here
        end = result.end_version
        baseline = _duckdb_matches_the_source(name, source, published_dir, end, skips)
        _spark_matches_the_source(name, source, published_dir, end, skips, baseline)


PARAMS = [pytest.param(r, id=r["path"], marks=[pytest.mark.corpus]) for r in ROWS if r["path"] not in HEAVY]
# The 300k-file log runs once (SQLite + local); the PostgreSQL + S3, MySQL and DuckDB passes cover
# the same code paths.
ALL_PARAMS = [pytest.param(r, id=r["path"], marks=[pytest.mark.corpus]) for r in ROWS]


@pytest.mark.spark  # the local pass reads with Delta-Spark (and delta-kernel-java) too
@pytest.mark.parametrize("row", ALL_PARAMS)
def test_corpus_table_on_sqlite_and_local_folder(
    row: dict[str, str], corpus_dir: Path, tmp_path: Path, record_property: Any
) -> None:
    location = (tmp_path / "published").as_uri()
    skips: list[str] = []
    _check_table(
        row,
        corpus_dir,
        f"sqlite:///{tmp_path}/store.db",
        location,
        {},
        lambda src: _copy_data(src, tmp_path / "published"),
        skips,
    )
    record_property("reader_skips", skips)


@pytest.mark.parametrize("row", PARAMS)
def test_corpus_table_on_postgres_and_s3(
    row: dict[str, str], corpus_dir: Path, pg_store_url: str, s3_env: str, s3: Any
) -> None:
    location = f"s3://{s3_env}/table"
    client = s3.client()
    _check_table(
        row,
        corpus_dir,
        pg_store_url,
        location,
        storage_options_for(location),
        lambda src: _upload_data(src, s3_env, "table", client),
    )


def _local_round_trip(row: dict[str, str], corpus: Path, store_url: str, tmp_path: Path) -> None:
    """The round trip into a local folder checked with the deltalake reader only: the commits byte for
    byte against the source, deltalake's version, files, rows, protocol and schema, every checkpoint's
    file set, ``validate`` (the other readers read the same published bytes on the SQLite pass)."""
    _check_table(
        row,
        corpus,
        store_url,
        (tmp_path / "published").as_uri(),
        {},
        lambda src: _copy_data(src, tmp_path / "published"),
    )


@pytest.mark.parametrize("row", PARAMS)
def test_corpus_table_on_mysql_and_local_folder(
    row: dict[str, str], corpus_dir: Path, mysql_store_url: str, tmp_path: Path
) -> None:
    _local_round_trip(row, corpus_dir, mysql_store_url, tmp_path)


@pytest.mark.duckdb
@pytest.mark.parametrize("row", PARAMS)
def test_corpus_table_on_duckdb_and_local_folder(
    row: dict[str, str], corpus_dir: Path, tmp_path: Path
) -> None:
    _local_round_trip(row, corpus_dir, f"duckdb:///{tmp_path / 'store.duckdb'}", tmp_path)


def test_corpus_has_every_category(corpus_dir: Path) -> None:
    categories = {r["category"] for r in ROWS}
    assert {"ok", "edge", "negative", "log-ok/data-unreadable"} <= categories


def test_kind_names_cover_checkpoints() -> None:
    part = parse_log_file("00000000000000000001.checkpoint.0000000001.0000000002.parquet")
    assert part is not None and part.kind is LogFileKind.MULTIPART_CHECKPOINT
