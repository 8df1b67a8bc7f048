"""delta-kernel-java (the Java kernel Trino, Flink and others build on) as an independent reader.

The reading is a small Java program (``jvm/kernel-reader``, built by ``make kernel-jar`` into
``jobs/validate/jars/``) run in its own JVM: it prints one JSON object with the table as the kernel
sees it, or an error whose ``kind`` tells the kernel's own "not supported" refusals
(:class:`ReaderLimitation`) from a table it cannot read (:class:`ReaderFailure`). No Airflow here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from delta_mirror.errors import PermanentError
from delta_mirror.storage import local_path, normalize_location

JAR_NAME = "delta-mirror-kernel-reader.jar"
JAR_ENV = "DELTA_MIRROR_KERNEL_JAR"  # another jar to use (a build elsewhere)
DEFAULT_TIMEOUT = 300.0
TIMEOUT_PER_VERSION = 15.0  # read_versions_with_kernel_java: a loaded machine, a large snapshot
# a small heap and a quick start: one short-lived JVM per call
JVM_OPTIONS = ("-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
_DOING = {"snapshot": "load the log of", "scan": "list the files of", "data": "read the data files of"}
_BUILD_HINT = (
    "build it with `make kernel-jar` (needs Maven and a JDK 17: apt-get install maven "
    "openjdk-17-jdk-headless), or use --reader deltalake, spark or duckdb"
)


class ReaderError(PermanentError):
    """delta-kernel-java could not give a view of the table (see the subclasses)."""

    def __init__(
        self,
        what: str,
        *,
        location: str,
        at_version: int | None,
        hint: str | None = None,
        phase: str | None = None,
    ) -> None:
        super().__init__(what, hint=hint)
        self.location = location
        self.at_version = at_version
        self.phase = phase  # "snapshot" (the log), "scan" (the file list), "data" (reading rows)


class ReaderUnavailable(ReaderError):
    """No Java or no jar here (or a location the jar cannot reach): nothing was read."""


class ReaderLimitation(ReaderError):
    """The kernel refused a feature it does not implement: the table may be fine."""


class ReaderFailure(ReaderError):
    """The kernel failed on the table (not a Delta table, a missing file, a broken log, a crash)."""


@dataclass(frozen=True)
class KernelProtocol:
    """The protocol as the kernel exposes it; feature lists are ``None`` below reader 3 / writer 7."""

    min_reader_version: int
    min_writer_version: int
    reader_features: tuple[str, ...] | None
    writer_features: tuple[str, ...] | None


@dataclass(frozen=True)
class KernelJavaView:
    """One snapshot as delta-kernel-java reads it.

    ``files`` are the data files of the kernel's scan relative to the table root, decoded as a
    Delta ``add.path`` is (the names on storage), sorted. ``num_records`` sums the files' stats
    (``None`` unless every file has them); ``deleted_records`` sums the deletion vectors'
    cardinalities; ``row_count`` is what reading the data returned (``None`` when not read).
    """

    version: int
    schema: str  # the kernel's schema serialized as Delta schema JSON
    schema_string: str  # ``metaData.schemaString`` as the kernel found it in the log
    table_id: str
    protocol: KernelProtocol
    partition_columns: tuple[str, ...]
    configuration: Mapping[str, str]
    files: tuple[str, ...]
    num_records: int | None
    deleted_records: int
    files_with_deletion_vectors: int
    row_count: int | None

    @property
    def logical_records(self) -> int | None:
        """Rows the stats promise once deletion vectors apply (``None`` without full stats)."""
        return None if self.num_records is None else self.num_records - self.deleted_records


def kernel_jar() -> Path | None:
    """The reader jar: ``$DELTA_MIRROR_KERNEL_JAR``, else the one ``make kernel-jar`` put in the package."""
    override = os.environ.get(JAR_ENV)
    if override:
        path = Path(override)
        return path if path.is_file() else None
    path = Path(__file__).resolve().parent / "jars" / JAR_NAME
    return path if path.is_file() else None


def java_binary() -> str | None:
    """``$JAVA_HOME/bin/java`` when set, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def read_with_kernel_java(
    location: str,
    version: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    count_rows: bool = True,
) -> KernelJavaView:
    """delta-kernel-java's view of the table at ``location`` (a local path or ``file:`` URI).

    ``version`` picks a version (default: the latest); ``count_rows=False`` skips reading the data.
    Raises :class:`ReaderUnavailable`, :class:`ReaderLimitation` or :class:`ReaderFailure`.
    """
    folder, command = _command(location, version)
    if not count_rows:
        command.append("--no-rows")
    lines = _run(command, location, version, timeout, folder)
    return _view(_single(lines, location, version), location, version)


def read_versions_with_kernel_java(
    location: str,
    versions: Sequence[int],
    timeout: float | None = None,
    *,
    count_rows: bool = True,
) -> dict[int, KernelJavaView | ReaderError]:
    """Several versions in one JVM (what a walk over a table's history wants): each version's view,
    or the :class:`ReaderLimitation` / :class:`ReaderFailure` it got. ``timeout`` is for the whole
    run (default: :data:`DEFAULT_TIMEOUT` plus :data:`TIMEOUT_PER_VERSION` for each version).
    """
    if not versions:
        return {}
    if timeout is None:
        timeout = DEFAULT_TIMEOUT + TIMEOUT_PER_VERSION * len(versions)
    if any(v < 0 for v in versions):
        raise ValueError(f"versions must be >= 0, not {sorted(versions)[0]}")
    folder, command = _command(location, None)
    command += ["--versions", ",".join(str(int(v)) for v in versions)]
    if not count_rows:
        command.append("--no-rows")
    lines = _run(command, location, None, timeout, folder)
    out: dict[int, KernelJavaView | ReaderError] = {}
    for body in lines:
        at = body.get("version")
        if not isinstance(at, int):
            raise ReaderFailure(
                f"delta-kernel-java printed a result without a version: {str(body)[:200]}",
                location=location,
                at_version=None,
            )
        try:
            out[at] = _view(body, location, at)
        except (ReaderLimitation, ReaderFailure) as exc:
            out[at] = exc
    missing = [v for v in versions if v not in out]
    if missing:
        raise ReaderFailure(
            f"delta-kernel-java stopped before version {missing[0]} of {location}",
            location=location,
            at_version=missing[0],
        )
    return out


def _command(location: str, version: int | None) -> tuple[str, list[str]]:
    """The folder to read and the java command line (ReaderUnavailable when it cannot run here)."""
    folder = _local_folder(location, version)
    java = java_binary()
    if java is None:
        raise ReaderUnavailable(
            "the kernel-java reader needs Java 17 or later and there is no `java` on PATH or in JAVA_HOME",
            location=location,
            at_version=version,
            hint="apt-get install openjdk-17-jre-headless, or use --reader deltalake, spark or duckdb",
        )
    jar = kernel_jar()
    if jar is None:
        where = os.environ.get(JAR_ENV) or str(Path(__file__).resolve().parent / "jars" / JAR_NAME)
        raise ReaderUnavailable(
            f"the kernel-java reader jar is missing ({where})",
            location=location,
            at_version=version,
            hint=_BUILD_HINT,
        )
    if version is not None and version < 0:
        raise ValueError(f"version must be >= 0, not {version}")
    command = [java, *JVM_OPTIONS, "-jar", str(jar), folder]
    if version is not None:
        command += ["--version", str(int(version))]
    return folder, command


def _local_folder(location: str, version: int | None) -> str:
    """The jar carries Hadoop's local file system only: local paths and ``file:`` URIs."""
    scheme = urlparse(location).scheme
    folder = local_path(normalize_location(location)) if scheme in ("", "file") else None
    if folder is None:
        raise ReaderUnavailable(
            f"the kernel-java reader reads local tables only, not {location} (its jar has no S3 client)",
            location=location,
            at_version=version,
            hint="use --reader deltalake, spark or duckdb for this table",
        )
    return str(folder)


def _run(
    command: list[str], location: str, version: int | None, timeout: float, folder: str
) -> list[dict[str, Any]]:
    """Run the JVM; the JSON objects it printed (stderr carries the kernel's warnings only)."""
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ReaderFailure(
            f"delta-kernel-java did not finish reading {folder} within {timeout:g}s",
            location=location,
            at_version=version,
            hint="a very large table or a stuck file system; raise the timeout",
        ) from exc
    except OSError as exc:
        raise ReaderUnavailable(
            f"cannot start java ({command[0]}): {exc}",
            location=location,
            at_version=version,
            hint=_BUILD_HINT,
        ) from exc
    lines: list[dict[str, Any]] = []
    for raw in done.stdout.splitlines():
        raw = raw.strip()
        if not raw.startswith("{"):
            continue
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(body, dict):
            lines.append(body)
    if not lines:
        tail = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()][-1:] or ["no output"]
        raise ReaderFailure(
            f"delta-kernel-java exited with code {done.returncode} reading {folder} "
            f"without a result: {tail[0][:300]}",
            location=location,
            at_version=version,
        )
    return lines


def _single(lines: list[dict[str, Any]], location: str, version: int | None) -> dict[str, Any]:
    if len(lines) != 1:
        raise ReaderFailure(
            f"delta-kernel-java printed {len(lines)} results for one read of {location}",
            location=location,
            at_version=version,
        )
    return lines[0]


def _view(body: dict[str, Any], location: str, version: int | None) -> KernelJavaView:
    """The view in ``body``, or its error raised as a limitation or a failure."""
    if "error" in body:
        at = "" if version is None else f" at version {version}"
        phase = body.get("phase")
        doing = _DOING.get(str(phase), "read")
        what = f"delta-kernel-java cannot {doing} {location}{at}: {body['error']}"
        if body.get("kind") == "unsupported":
            raise ReaderLimitation(
                what,
                location=location,
                at_version=version,
                hint="the kernel does not implement a feature this table uses; read it with another reader",
                phase=phase,
            )
        raise ReaderFailure(what, location=location, at_version=version, phase=phase)
    try:
        protocol = body["protocol"]
        return KernelJavaView(
            version=int(body["version"]),
            schema=str(body["schema"]),
            schema_string=str(body.get("schemaString") or ""),
            table_id=str(body.get("tableId") or ""),
            protocol=KernelProtocol(
                int(protocol["minReaderVersion"]),
                int(protocol["minWriterVersion"]),
                _names(protocol.get("readerFeatures")),
                _names(protocol.get("writerFeatures")),
            ),
            partition_columns=tuple(str(c) for c in body.get("partitionColumns") or ()),
            configuration={str(k): str(v) for k, v in (body.get("configuration") or {}).items()},
            files=tuple(sorted(str(f) for f in body["files"])),
            num_records=_int_or_none(body.get("numRecords")),
            deleted_records=int(body.get("deletedRecords") or 0),
            files_with_deletion_vectors=int(body.get("filesWithDeletionVectors") or 0),
            row_count=_int_or_none(body.get("rowCount")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ReaderFailure(
            f"delta-kernel-java printed an unexpected result for {location}: {exc!r}",
            location=location,
            at_version=version,
            hint="the jar and this module disagree: rebuild it with `make kernel-jar`",
        ) from exc


def _names(value: Any) -> tuple[str, ...] | None:
    return None if value is None else tuple(sorted(str(v) for v in value))


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


__all__ = [
    "KernelJavaView",
    "KernelProtocol",
    "ReaderError",
    "ReaderFailure",
    "ReaderLimitation",
    "ReaderUnavailable",
    "java_binary",
    "kernel_jar",
    "read_versions_with_kernel_java",
    "read_with_kernel_java",
]
