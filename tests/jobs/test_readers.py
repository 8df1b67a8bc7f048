"""The reader contract: one registry of readers (names, schemes, what to use instead) and the
report's cap on what it lists (unit tests; the readers themselves are tested in test_validate.py,
test_reader_limits.py, test_kernel_java_reader.py and tests/spark)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner

from delta_mirror.errors import PermanentError, first_line
from delta_mirror.jobs.validate.limits import unsupported_feature
from delta_mirror.jobs.validate.readers import READERS, location_scheme, reader_for, reader_names
from delta_mirror.jobs.validate.report import (
    MAX_PROBLEMS_PER_KIND,
    Limitation,
    Problem,
    ReaderReport,
    ValidationReport,
)

CAP = MAX_PROBLEMS_PER_KIND


@dataclass(frozen=True)
class _Table:
    """What ``reader_for`` reads of a table."""

    name: str
    location: str


@pytest.mark.parametrize(
    ("location", "scheme"),
    [
        ("/data/t", "local"),
        ("file:///data/t", "local"),
        ("s3://bucket/t", "s3"),
        ("s3a://bucket/t", "s3"),
        ("az://container/t", "azure"),
        ("abfss://container@account.dfs.core.windows.net/t", "azure"),
        ("gs://bucket/t", "gcs"),
        ("hdfs://namenode/t", "hdfs"),
    ],
)
def test_a_location_has_one_scheme_for_every_reader(location: str, scheme: str) -> None:
    assert location_scheme(location) == scheme


def test_the_registry_lists_each_reader_once_in_the_order_the_cli_shows_them() -> None:
    assert reader_names() == ("deltalake", "spark", "duckdb", "kernel-java", "auto")
    assert all(READERS[name].name == name for name in reader_names())


def test_the_cli_offers_exactly_the_registered_readers() -> None:
    from delta_mirror.cli import cli

    result = CliRunner().invoke(cli, ["validate", "--help"])
    assert result.exit_code == 0, result.output
    assert "[deltalake|spark|duckdb|kernel-java|auto]" in result.output


@pytest.mark.parametrize(
    ("reader", "reads", "use_instead"),
    [
        ("deltalake", {"local", "s3", "azure", "gcs"}, "spark (or duckdb / kernel-java)"),
        ("spark", {"local", "s3"}, "deltalake or duckdb"),
        ("duckdb", {"local"}, "spark (or kernel-java)"),
        ("kernel-java", {"local"}, "spark"),
        ("auto", {"local", "s3", "azure", "gcs"}, "spark (or duckdb / kernel-java)"),
    ],
)
def test_each_reader_says_what_it_reads_and_what_to_use_instead(
    reader: str, reads: set[str], use_instead: str
) -> None:
    assert READERS[reader].schemes == reads
    assert READERS[reader].use_instead == use_instead


@pytest.mark.parametrize(
    ("reader", "location", "message", "hint"),
    [
        (
            "spark",
            "gs://b/t",
            "the spark reader reads local and S3 tables, not gs://b/t",
            "--reader deltalake for",
        ),
        (
            "duckdb",
            "s3://b/t",
            "the duckdb reader reads local tables, not s3://b/t",
            "--reader deltalake or --reader spark for",
        ),
        (
            "kernel-java",
            "az://c/t",
            "the kernel-java reader reads local tables",
            "use --reader deltalake for",
        ),
        ("nope", "/t", "unknown reader 'nope'", "use one of deltalake, spark, duckdb, kernel-java, auto"),
    ],
)
def test_a_reader_that_cannot_read_the_location_is_refused_naming_one_that_can(
    reader: str, location: str, message: str, hint: str
) -> None:
    with pytest.raises(PermanentError) as raised:
        reader_for(reader, _Table("t", location))  # type: ignore[arg-type]
    assert message in raised.value.message
    assert hint in (raised.value.hint or "")


@pytest.mark.parametrize(
    ("reader", "location"),
    [
        ("deltalake", "gs://b/t"),
        ("auto", "az://c/t"),
        ("spark", "s3a://b/t"),
        ("duckdb", "/t"),
        ("kernel-java", "file:///t"),
    ],
)
def test_a_reader_that_reads_the_location_is_returned(reader: str, location: str) -> None:
    assert reader_for(reader, _Table("t", location)).name == reader  # type: ignore[arg-type]


def _report() -> ValidationReport:
    return ValidationReport("t", "/t", 0, 99, 100)


@pytest.mark.parametrize(
    ("found", "listed", "note"),
    [
        (1, 1, None),
        (CAP, CAP, None),
        (CAP + 1, CAP + 1, "... and 1 more reader_files problem not listed"),
        (CAP + 7, CAP + 1, "... and 7 more reader_files problems not listed"),
    ],
)
def test_the_report_lists_the_first_problems_of_a_kind_and_says_how_many_more(
    found: int, listed: int, note: str | None
) -> None:
    report = _report()
    for v in range(found):
        report.add_problem(Problem("reader_files", v, f"at version {v}: differs", "hint"))
    assert len(report.problems) == listed
    assert [p.version for p in report.problems[:CAP]] == list(range(min(found, CAP)))
    if note is None:
        assert not any("not listed" in p.message for p in report.problems)
    else:
        last = report.problems[-1]
        assert (last.kind, last.version, last.message) == ("reader_files", CAP, note)


def test_the_cap_is_per_kind_and_the_note_stays_in_place() -> None:
    report = _report()
    for v in range(CAP + 3):
        report.add_problem(Problem("reader_rows", v, "rows", "h"))
        report.add_problem(Problem("reader_schema", v, "schema", "h"))
    report.add_problem(Problem("reader_txn", 5, "txn", "h"))
    kinds = [p.kind for p in report.problems]
    assert kinds.count("reader_rows") == kinds.count("reader_schema") == CAP + 1
    assert kinds[-1] == "reader_txn"
    notes = [p.message for p in report.problems if "not listed" in p.message]
    assert notes == [
        "... and 3 more reader_rows problems not listed",
        "... and 3 more reader_schema problems not listed",
    ]


def test_limitations_are_capped_per_reader_and_keep_the_reader_to_use_instead() -> None:
    report = _report()
    duckdb = ReaderReport(READERS["duckdb"], report)
    for v in range(CAP + 2):
        duckdb.limitation(v, "cannot read")
    ReaderReport(READERS["kernel-java"], report).limitation(1, "cannot read")
    last_duckdb = [lim for lim in report.limitations if lim.reader == "duckdb"][-1]
    assert last_duckdb == Limitation(
        "duckdb", CAP, "... and 2 more limitations of duckdb not listed", "spark (or kernel-java)"
    )
    assert report.limitations[-1] == Limitation("kernel-java", 1, "cannot read", "spark")
    assert len(report.limitations) == CAP + 2


def test_a_limitation_names_the_registered_reader_to_use_instead() -> None:
    for reader in READERS.values():
        limit = unsupported_feature(reader, 3, "Unsupported table features required: [X]")
        assert limit is not None and (limit.reader, limit.use_instead) == (reader.name, reader.use_instead)


class _WithTrace(Exception):
    pass


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (ValueError("plain"), "ValueError: plain"),
        (
            _WithTrace("Generic error: no log\n\nStack backtrace:\n   0: deltalake::open\n   1: main"),
            "_WithTrace: Generic error: no log Stack backtrace:",
        ),
        (
            _WithTrace(
                "An error occurred while calling o45.load.\n: DeltaAnalysisException: [X] gone\n\tat org.a.B(B.java:1)"
            ),
            "_WithTrace: An error occurred while calling o45.load. : DeltaAnalysisException: [X] gone",
        ),
        (_WithTrace("[X] gone\n\nJVM stacktrace:\norg.a.B"), "_WithTrace: [X] gone"),
        (_WithTrace("IO Error: no file\n\nLINE 1: SELECT"), "_WithTrace: IO Error: no file LINE 1: SELECT"),
        (ValueError("x" * 600), "ValueError: " + "x" * 500),
    ],
)
def test_a_reader_error_is_one_line_without_its_stack_trace(exc: BaseException, text: str) -> None:
    assert first_line(exc, 500, joined=True) == text


def test_the_report_json_shows_the_note_as_a_problem_like_any_other() -> None:
    report = _report()
    for v in range(CAP + 1):
        report.add_problem(Problem("reader_error", v, "x", "h"))
    out: dict[str, Any] = report.to_json()
    assert out["ok"] is False and len(out["problems"]) == CAP + 1
    assert out["problems"][-1]["message"] == "... and 1 more reader_error problem not listed"
