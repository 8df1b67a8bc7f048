"""The readers validation can read a published table with, behind one contract and one registry.

Each reader says which location schemes it reads (``local``, ``s3``, ``azure``, ``gcs``), which
reader to use when it cannot read something, and checks versions ``lo..hi`` against the store,
writing what it finds into the report. ``READERS`` is the one list of them: ``validate_table``
dispatches on it, the CLI offers its names (``--reader``), and a limitation names its
``use_instead``. A reader's module is imported when it checks (pyspark and duckdb are extras).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from delta_mirror.errors import PermanentError
from delta_mirror.jobs.validate.report import ReaderReport, ValidationReport, version_runs
from delta_mirror.storage import AZURE_SCHEMES, GCS_SCHEMES, S3_SCHEMES

if TYPE_CHECKING:  # the CLI lists READERS at start-up, before any store (and SQLAlchemy) loads
    from delta_mirror.store.sql_store import SqlStore, TableInfo

LOCAL, S3, AZURE, GCS = "local", "s3", "azure", "gcs"
_LABELS = {LOCAL: "local", S3: "S3", AZURE: "Azure", GCS: "GCS"}


def location_scheme(location: str) -> str:
    """Which kind of storage a table location is: ``local``, ``s3``, ``azure``, ``gcs`` (else its
    URI scheme). ``s3a://`` is S3, a path or ``file://`` is local."""
    scheme = urlparse(location).scheme
    if scheme in ("", "file"):
        return LOCAL
    for kind, names in ((S3, S3_SCHEMES), (AZURE, AZURE_SCHEMES), (GCS, GCS_SCHEMES)):
        if scheme in names:
            return kind
    return scheme


@dataclass(frozen=True)
class ReadOptions:
    """What a reader may need beyond the range: credentials, a Spark session, the listing's result."""

    storage_options: Mapping[str, str] | None = None
    spark: Any = None  # a SparkSession for the spark reader (else ``get_spark()``)
    checkpoints: frozenset[int] = field(default_factory=frozenset)  # complete checkpoints listed


NO_OPTIONS = ReadOptions()


class Reader(Protocol):
    """A Delta reader validation compares with the store."""

    @property
    def name(self) -> str: ...

    @property
    def schemes(self) -> frozenset[str]: ...

    @property
    def use_instead(self) -> str: ...

    def check(
        self, store: SqlStore, table: TableInfo, lo: int, hi: int, report: ValidationReport, opts: ReadOptions
    ) -> None:
        """Compare this reader's view of versions ``lo..hi`` with the store; findings go to ``report``."""
        ...


# A reader's walk over lo..hi, writing through its own handle on the report.
Run = Callable[["SqlStore", "TableInfo", int, int, ReaderReport, ReadOptions], None]


@dataclass(frozen=True)
class RegisteredReader:
    """A reader of the registry: what it reads, and the function that reads."""

    name: str
    schemes: frozenset[str]
    use_instead: str
    run: Run = field(repr=False)

    def check(
        self,
        store: SqlStore,
        table: TableInfo,
        lo: int,
        hi: int,
        report: ValidationReport,
        opts: ReadOptions = NO_OPTIONS,
    ) -> None:
        self.run(store, table, lo, hi, ReaderReport(self, report), opts)


def _deltalake(
    store: SqlStore, table: TableInfo, lo: int, hi: int, out: ReaderReport, opt: ReadOptions
) -> None:
    _deltalake_walk(store, table, lo, hi, out, opt)


def _deltalake_walk(
    store: SqlStore, table: TableInfo, lo: int, hi: int, out: ReaderReport, opt: ReadOptions
) -> set[int]:
    """Check with deltalake; the versions it cannot read (limitations)."""
    from delta_mirror.jobs.validate.reader_view import ReaderCheck

    check = ReaderCheck(store, table, lo, hi, set(opt.checkpoints), out, opt.storage_options)
    check.run()
    return check.unreadable


def _spark(store: SqlStore, table: TableInfo, lo: int, hi: int, out: ReaderReport, opt: ReadOptions) -> None:
    from delta_mirror.jobs.validate.spark_reader import spark_check  # pyspark is optional (the spark extra)

    spark_check(store, table, lo, hi, out, opt.spark, opt.storage_options)


def _duckdb(store: SqlStore, table: TableInfo, lo: int, hi: int, out: ReaderReport, opt: ReadOptions) -> None:
    from delta_mirror.jobs.validate.duckdb_reader import DuckDBCheck  # duckdb is optional

    DuckDBCheck(store, table, out).run(lo, hi)


def _kernel_java(
    store: SqlStore, table: TableInfo, lo: int, hi: int, out: ReaderReport, opt: ReadOptions
) -> None:
    from delta_mirror.jobs.validate.kernel_java_check import KernelJavaCheck

    KernelJavaCheck(store, table, out).run(lo, hi)


def _auto(store: SqlStore, table: TableInfo, lo: int, hi: int, out: ReaderReport, opt: ReadOptions) -> None:
    """deltalake, and Delta-Spark for the versions deltalake cannot read (when Spark is installed)."""
    unreadable = _deltalake_walk(store, table, lo, hi, ReaderReport(DELTALAKE, out.report), opt)
    if unreadable:
        _spark_fallback(store, table, sorted(unreadable), out.report, opt)


_EVERYWHERE = frozenset({LOCAL, S3, AZURE, GCS})
DELTALAKE = RegisteredReader("deltalake", _EVERYWHERE, "spark (or duckdb / kernel-java)", _deltalake)
SPARK = RegisteredReader("spark", frozenset({LOCAL, S3}), "deltalake or duckdb", _spark)
READERS: Mapping[str, Reader] = {
    r.name: r
    for r in (
        DELTALAKE,
        SPARK,
        RegisteredReader("duckdb", frozenset({LOCAL}), "spark (or kernel-java)", _duckdb),
        RegisteredReader("kernel-java", frozenset({LOCAL}), "spark", _kernel_java),
        RegisteredReader("auto", _EVERYWHERE, DELTALAKE.use_instead, _auto),
    )
}


def reader_names() -> tuple[str, ...]:
    """Every ``--reader`` choice, in the order the CLI shows them."""
    return tuple(READERS)


def reader_for(name: str, table: TableInfo) -> Reader:
    """The reader called ``name``, refused when unknown or when it cannot read the table's location."""
    reader = READERS.get(name)
    if reader is None:
        raise PermanentError(
            f"unknown reader '{name}'", table=table.name, hint=f"use one of {', '.join(READERS)}"
        )
    scheme = location_scheme(table.location)
    if scheme not in reader.schemes:
        others = [f"--reader {r.name}" for r in READERS.values() if scheme in r.schemes and r.name != "auto"]
        raise PermanentError(
            f"the {reader.name} reader reads {_spell(reader.schemes)} tables, not {table.location}",
            table=table.name,
            hint=f"use {' or '.join(others) or 'another reader'} for this table",
        )
    return reader


def _spell(schemes: frozenset[str]) -> str:
    names = [label for key, label in _LABELS.items() if key in schemes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _spark_fallback(
    store: SqlStore, table: TableInfo, versions: list[int], report: ValidationReport, options: ReadOptions
) -> None:
    """``--reader auto``: Delta-Spark reads the versions deltalake could not; their limitations go."""
    if location_scheme(table.location) not in SPARK.schemes:
        return
    if options.spark is None:
        if importlib.util.find_spec("pyspark") is None:
            return  # Spark is not installed: the limitations stay, naming it
        try:
            from delta_mirror.spark.session import get_spark

            options = ReadOptions(options.storage_options, get_spark(), options.checkpoints)
        except Exception:
            return
    for first, last in version_runs(versions):
        SPARK.check(store, table, first, last, report, options)
    covered = set(versions)
    report.limitations[:] = [
        lim
        for lim in report.limitations
        if not (lim.reader == DELTALAKE.name and (lim.version is None or lim.version in covered))
    ]
    span = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in version_runs(versions))
    what = f"version {versions[0]}" if len(versions) == 1 else f"versions {span}"
    report.fallbacks.append(f"{what} read with spark (deltalake cannot read it)")


__all__ = [
    "NO_OPTIONS",
    "READERS",
    "ReadOptions",
    "Reader",
    "RegisteredReader",
    "location_scheme",
    "reader_for",
    "reader_names",
]
