"""Validation, part 2: a Delta reader's view of each version against the store's.

The store side is computed incrementally: the snapshot and active files at the first version,
then each commit's actions applied in order (one commit costs O(its actions), not O(history)).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, TypeGuard
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from delta_mirror.delta.actions import line_action
from delta_mirror.delta.protocol import now_ms, parse_interval_ms
from delta_mirror.delta.replay import FileKey, LogReplay, file_key
from delta_mirror.errors import first_line
from delta_mirror.jobs.validate.limits import judge_dv_failure, unsupported_feature
from delta_mirror.jobs.validate.report import Limitation, ReaderReport
from delta_mirror.jobs.validate.rows import num_records
from delta_mirror.jobs.validate.schema_diff import schema_diffs, type_text
from delta_mirror.storage import ObjectStore, local_path, normalize_location, open_store, storage_options_for
from delta_mirror.store.source_import import checkpoint_state_versions
from delta_mirror.store.sql_store import FileEntry, SqlStore, TableInfo

_BATCH = 200  # versions per store query while walking a range


_READER_HINT = (
    "deltalake could not load this version of the published log: see the log problems reported "
    "with it (missing or foreign commits, a bad _last_checkpoint); if the log is intact the "
    "table may use a feature deltalake does not support"
)
_FILES_HINT = (
    "the published log and SQL disagree on the table's files: a commit or checkpoint file was "
    "changed after publishing, or the checkpoint builder wrote a wrong file list; look for "
    "hash_mismatch problems and rewrite the checkpoint"
)


@dataclass
class _Schema:
    """What partition values need from the metadata: column types and physical names."""

    partition_columns: list[str]
    physical: list[str]  # the keys of ``partitionValues`` (column mapping renames them)
    types: list[Any]
    type_keys: list[str]


class StoreState(LogReplay[FileEntry]):
    """The store's view of one version, advanced commit by commit (the one replay, ``delta.replay``).

    ``with_records``: also keep each file's ``numRecords`` (for readers that count rows).
    """

    protocol: dict[str, Any]  # the store's snapshot always has both
    metadata: dict[str, Any]

    def __init__(
        self, store: SqlStore, table: TableInfo, version: int, *, with_records: bool = False
    ) -> None:
        super().__init__()
        self._store, self._table, self._with_records = store, table, with_records
        # An import may have taken a version's state from the source's checkpoint (store.source_import):
        # there the store's state is not the previous one plus the commit, so the view restarts.
        self._restarts = checkpoint_state_versions(table.settings)
        self.restart(version)

    def restart(self, version: int) -> None:
        """Read the store's state at ``version`` afresh (every field of the view is replaced)."""
        store, table_id = self._store, self._table.id
        snap = store.snapshot(table_id, version)
        self.version = version
        self.protocol = json.loads(snap.protocol)["protocol"]
        self.metadata = json.loads(snap.metadata)["metaData"]
        self.txns, self.domains = {}, {}
        for line in (*snap.txns, *snap.domain_metadata):
            self.action(*line_action(json.loads(line)))
        self.files = {FileKey(f.path, f.dv_id): f for f in store.active_files(table_id, version)}
        # file key -> the comparable form of its entry; kept in step with ``files``
        self.views: dict[FileKey, tuple[str, tuple[Any, ...]]] = {}
        self.cardinality: dict[FileKey, int] = {}  # rows deleted by each file's DV
        self.dvs: dict[FileKey, dict[str, Any]] = {}  # each file's DV descriptor
        self.records: dict[FileKey, int | None] | None = {} if self._with_records else None
        if self._with_records or any(key.dv_id for key in self.files):
            for batch in store.iter_active_add_lines(table_id, version):
                for line in batch:
                    if self._with_records or '"deletionVector"' in line:
                        add = json.loads(line)["add"]
                        self._extras(file_key(add), add)

    def apply(self, lines: Iterable[str]) -> None:
        """The next version's commit (``LogReplay.apply``), or a restart where an import recorded
        a source checkpoint's state."""
        if self.version + 1 in self._restarts:
            self.restart(self.version + 1)
            return
        self.version += 1
        super().apply(lines)

    def txn_versions(self) -> dict[str, tuple[int, int | None]]:
        """appId -> (version, ``lastUpdated`` when it is an integer)."""
        out: dict[str, tuple[int, int | None]] = {}
        for app_id, body in self.txns.items():
            updated = body.get("lastUpdated")
            out[app_id] = (int(body["version"]), updated if _is_int(updated) else None)
        return out

    def row_inputs(self) -> list[tuple[str, int | None, int]]:
        """(path, numRecords, rows deleted by its DV) of every active file (``with_records`` only)."""
        records = self.records or {}
        return [(k.path, records.get(k), self.cardinality.get(k, 0)) for k in self.files]

    def _file(self, key: FileKey, add: dict[str, Any], line: str) -> FileEntry:
        size = add.get("size")
        self.views.pop(key, None)
        self._extras(key, add)
        return FileEntry(key.path, key.dv_id, size if _is_int(size) else None, add.get("partitionValues"))

    def _removed(self, key: FileKey) -> None:
        self.views.pop(key, None)
        self.cardinality.pop(key, None)
        self.dvs.pop(key, None)
        if self.records is not None:
            self.records.pop(key, None)

    def _extras(self, key: FileKey, add: dict[str, Any]) -> None:
        dv = add.get("deletionVector")
        if isinstance(dv, dict):
            self.cardinality[key] = int(dv.get("cardinality") or 0)
            self.dvs[key] = dv
        if self.records is not None:
            self.records[key] = num_records(add)


class ReaderCheck:
    """Walk ``lo..hi`` with deltalake (incrementally) and compare every version with the store."""

    def __init__(
        self,
        store: SqlStore,
        table: TableInfo,
        lo: int,
        hi: int,
        checkpoints: set[int],
        report: ReaderReport,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        self.store, self.table, self.lo, self.hi = store, table, lo, hi
        self.out = report
        self.unreadable: set[int] = set()  # versions deltalake cannot read (limitations)
        self._objects: ObjectStore | None = None
        self.checkpoints = {v for v in checkpoints if lo < v <= hi}
        self.uri = normalize_location(table.location)
        self.options = storage_options_for(self.uri, storage_options)
        folder = local_path(self.uri)
        roots = {self.uri + "/", unquote(self.uri) + "/", table.location.rstrip("/") + "/"}
        if folder is not None:
            roots.add(str(folder) + "/")
        self.roots = sorted(roots, key=len, reverse=True)
        self._rel_cache: dict[str, str] = {}
        self._schema_key: str | None = None
        self._schema: _Schema | None = None
        self._text_cache: dict[tuple[str, str | None], Any] = {}

    # -- walking ----------------------------------------------------------------------------------
    def run(self) -> None:
        """Load each version incrementally; at a checkpoint version start afresh from the checkpoint.

        A fresh open is what every new reader of the table does, so the checkpoint's own content is
        compared (deltalake 1.6.6 would use it on an incremental load too, but that is its choice).
        """
        state = StoreState(self.store, self.table, self.lo)
        dt, error = self._open(self.lo)
        failures: list[tuple[int, str]] = []
        if error is not None:
            if self._open(self.hi)[1] is not None:
                limit = unsupported_feature(self.out.reader, None, error)
                if limit is not None:
                    self._limit(limit)
                    self.unreadable.update(range(self.lo, self.hi + 1))
                    return
                self._report(
                    "reader_error",
                    None,
                    f"deltalake cannot open the table at {self.uri} (versions {self.lo}..{self.hi}): {error}",
                    _READER_HINT,
                )
                return
            failures.append((self.lo, error))
        else:
            self._compare(dt, self.lo, state, "")
        for start in range(self.lo + 1, self.hi + 1, _BATCH):
            end = min(self.hi, start + _BATCH - 1)
            lines = self.store.commit_lines(self.table.id, start, end)
            for version in range(start, end + 1):
                state.apply(lines.get(version, []))
                from_checkpoint = version in self.checkpoints
                if dt is None or from_checkpoint:
                    dt, error = self._open(version)
                else:
                    try:
                        dt.load_as_version(version)
                    except BaseException as exc:
                        _reraise_interrupts(exc)
                        dt, error = None, first_line(exc, 500, joined=True)
                if dt is None:
                    failures.append((version, error or "unknown error"))
                    continue
                self._compare(dt, version, state, " (read from its checkpoint)" if from_checkpoint else "")
        self._report_failures(failures)

    def _open(self, version: int) -> tuple[Any, str | None]:
        """A fresh reader at ``version`` (it starts from the newest checkpoint at or before it)."""
        try:
            return DeltaTable(self.uri, version=version, storage_options=self.options), None
        except BaseException as exc:
            _reraise_interrupts(exc)
            return None, first_line(exc, 500, joined=True)

    def _report_failures(self, failures: list[tuple[int, str]]) -> None:
        """Consecutive versions failing with the same error are one problem."""
        i = 0
        while i < len(failures):
            j = i
            while (
                j + 1 < len(failures)
                and failures[j + 1][0] == failures[j][0] + 1
                and failures[j + 1][1] == failures[i][1]
            ):
                j += 1
            first, last, text = failures[i][0], failures[j][0], failures[i][1]
            span = f"version {first}" if first == last else f"versions {first}..{last}"
            limit = unsupported_feature(self.out.reader, first, f"{span}: {text}")
            if limit is not None:
                self._limit(limit)
                self.unreadable.update(range(first, last + 1))
            else:
                self._report("reader_error", first, f"deltalake cannot load {span}: {text}", _READER_HINT)
            i = j + 1

    def _limit(self, limitation: Limitation) -> None:
        self.out.add(limitation)

    def _report(self, kind: str, version: int | None, message: str, hint: str) -> None:
        self.out.problem(kind, version, message, hint)

    def _exists(self, path: str) -> bool:
        """Whether a file the log names (relative to the table root, or absolute) is in storage."""
        rel = self._rel(path)
        if "://" in rel or rel.startswith("/"):
            return False  # outside the table root: not checked here, so not proven present
        if self._objects is None:
            self._objects = open_store(self.uri, self.options)
        return self._objects.head(rel) is not None

    # -- comparing one version --------------------------------------------------------------------
    def _compare(self, dt: Any, version: int, state: StoreState, via: str) -> None:
        at = f"at version {version}{via}"
        found_version = dt.version()
        if found_version != version:
            self._report(
                "reader_version",
                version,
                f"deltalake loaded version {found_version} when asked for version {version}{via}",
                _READER_HINT,
            )
            return
        self._compare_protocol(dt, version, state, at)
        self._compare_metadata(dt, version, state, at)
        self._compare_files(dt, version, state, at)
        retention = (state.metadata.get("configuration") or {}).get("delta.setTransactionRetentionDuration")
        cutoff = now_ms() - parse_interval_ms(retention, 0) if retention else None
        for app_id, (expected, updated) in sorted(state.txn_versions().items()):
            found = dt.transaction_version(app_id)
            expired = cutoff is not None and updated is not None and updated < cutoff
            if found != expected and not (expired and found is None):  # readers drop expired txns
                self._report(
                    "reader_txn",
                    version,
                    f"{at}: deltalake has txn version {found} for appId '{app_id}', the store {expected}",
                    "a txn action was lost or changed in the published log or checkpoint; idempotent "
                    "writers relying on it may write twice. Rewrite the checkpoint",
                )

    def _compare_protocol(self, dt: Any, version: int, state: StoreState, at: str) -> None:
        p = state.protocol
        expected = (
            p.get("minReaderVersion"),
            p.get("minWriterVersion"),
            sorted(p.get("readerFeatures") or []),
            sorted(p.get("writerFeatures") or []),
        )
        rp = dt.protocol()
        found = (
            rp.min_reader_version,
            rp.min_writer_version,
            sorted(rp.reader_features or []),
            sorted(rp.writer_features or []),
        )
        if found != expected:
            self._report(
                "reader_protocol",
                version,
                f"{at}: deltalake sees protocol (reader {found[0]}, writer {found[1]}, reader features "
                f"{found[2]}, writer features {found[3]}); the store has (reader {expected[0]}, writer "
                f"{expected[1]}, reader features {expected[2]}, writer features {expected[3]})",
                "the protocol action in the published log or checkpoint differs from SQL; check for "
                "hash_mismatch problems and rewrite the checkpoint",
            )

    def _compare_metadata(self, dt: Any, version: int, state: StoreState, at: str) -> None:
        md = state.metadata
        m = dt.metadata()
        diffs = []
        for label, found, expected in (
            ("id", m.id, md.get("id")),
            ("partitionColumns", list(m.partition_columns), list(md.get("partitionColumns") or [])),
            ("configuration", dict(m.configuration or {}), dict(md.get("configuration") or {})),
            ("name", m.name or None, md.get("name") or None),
            ("description", m.description or None, md.get("description") or None),
        ):
            if found != expected:
                diffs.append(f"{label}: deltalake {found!r}, store {expected!r}")
        if diffs:
            self._report(
                "reader_metadata",
                version,
                f"{at}: metaData differs: " + "; ".join(diffs),
                "the metaData action in the published log or checkpoint differs from SQL; check for "
                "hash_mismatch problems and rewrite the checkpoint",
            )
        expected_schema = json.loads(md.get("schemaString") or "{}")
        found_schema = json.loads(dt.schema().to_json())
        diffs = schema_diffs(expected_schema, found_schema, "")
        if diffs:
            shown = "; ".join(diffs[:5]) + (f" (+{len(diffs) - 5} more)" if len(diffs) > 5 else "")
            self._report(
                "reader_schema",
                version,
                f"{at}: schema differs (store vs deltalake): {shown}",
                "the schemaString readers parse is not the store's; check the metaData action for "
                "hash_mismatch problems. If only a type's spelling differs, deltalake may not "
                "support that type yet",
            )

    # -- files --------------------------------------------------------------------------------------
    def _partition_schema(self, state: StoreState) -> _Schema:
        md = state.metadata
        config = md.get("configuration") or {}
        key = json.dumps(
            [md.get("schemaString"), md.get("partitionColumns"), config.get("delta.columnMapping.mode")]
        )
        if key != self._schema_key or self._schema is None:
            fields = {f.get("name"): f for f in json.loads(md.get("schemaString") or "{}").get("fields", [])}
            mapped = config.get("delta.columnMapping.mode", "none") != "none"
            cols = [str(c) for c in md.get("partitionColumns") or []]
            physical = [
                str(((fields.get(c) or {}).get("metadata") or {}).get("delta.columnMapping.physicalName", c))
                if mapped
                else c
                for c in cols
            ]
            types = [(fields.get(c) or {}).get("type") for c in cols]
            self._schema_key = key
            self._schema = _Schema(cols, physical, types, [type_text(t) for t in types])
            state.views.clear()
        return self._schema

    def _rel(self, path: str) -> str:
        """A path relative to the table root, percent-decoded (readers differ in both respects)."""
        rel = self._rel_cache.get(path)
        if rel is None:
            rel = path
            for root in self.roots:
                if rel.startswith(root):
                    rel = rel[len(root) :]
                    break
            rel = self._rel_cache[path] = unquote(rel)
        return rel

    def _store_view(self, state: StoreState, schema: _Schema) -> dict[str, tuple[Any, ...]]:
        out: dict[str, tuple[Any, ...]] = {}
        views = state.views
        for key, f in state.files.items():
            view = views.get(key)
            if view is None:
                pv = f.partition_values or {}
                values = tuple(
                    self._from_text(t, tk, pv.get(p, pv.get(c)))
                    for c, p, t, tk in zip(
                        schema.partition_columns, schema.physical, schema.types, schema.type_keys, strict=True
                    )
                )
                view = views[key] = (self._rel(f.path), (f.size, values))
            out[view[0]] = view[1]
        return out

    def _from_text(self, typ: Any, type_key: str, text: str | None) -> Any:
        key = (type_key, text)
        if key not in self._text_cache:
            self._text_cache[key] = _partition_from_text(typ, text)
        return self._text_cache[key]

    def _compare_files(self, dt: Any, version: int, state: StoreState, at: str) -> None:
        schema = self._partition_schema(state)
        adds = pa.table(dt.get_add_actions(flatten=True))
        columns = []
        for c, t in zip(schema.partition_columns, schema.types, strict=True):
            name = f"partition.{c}"
            values = adds.column(name).to_pylist() if name in adds.column_names else [None] * adds.num_rows
            columns.append([_partition_from_reader(t, v) for v in values])
        paths = adds.column("path").to_pylist()
        sizes = adds.column("size_bytes").to_pylist()
        found = {
            self._rel(p): (s, tuple(col[i] for col in columns))
            for i, (p, s) in enumerate(zip(paths, sizes, strict=True))
        }
        expected = self._store_view(state, schema)
        if found != expected:

            def show(entry: tuple[Any, ...]) -> str:
                values = ", ".join(
                    f"{c}={v}" for c, v in zip(schema.partition_columns, entry[1], strict=True)
                )
                return f"size {entry[0]}" + (f", {values}" if values else "")

            parts = _differences(
                expected,
                found,
                *_FILES_ON_ONE_SIDE,
                lambda n, p: (
                    f"{n} with a different size or partition values (e.g. {p}: store "
                    f"{show(expected[p])}; deltalake {show(found[p])})"
                ),
            )
            head = f"deltalake sees {len(found)} active files, the store {len(expected)}"
            self._report("reader_files", version, f"{at}: " + "; ".join([head, *parts]), _FILES_HINT)
        self._compare_deletion_vectors(dt, version, state, at)

    def _compare_deletion_vectors(self, dt: Any, version: int, state: StoreState, at: str) -> None:
        """Which files have a DV and how many rows each deletes (deltalake exposes no DV id)."""
        expected = {self._rel(key[0]): n for key, n in state.cardinality.items()}
        if not expected and "deletionVectors" not in (state.protocol.get("readerFeatures") or []):
            return
        try:
            dvs = pa.table(dt.deletion_vectors().read_all())
        except BaseException as exc:
            _reraise_interrupts(exc)
            verdict = judge_dv_failure(
                self.out.reader,
                version,
                first_line(exc, 500, joined=True),
                [(k[0], dv) for k, dv in state.dvs.items()],
                self._exists,
            )
            self.out.add(verdict)
            if isinstance(verdict, Limitation):
                self.unreadable.add(version)
            return
        vectors = dvs.column("selection_vector").combine_chunks()
        deleted = (
            pa.table(
                {
                    "row": pc.list_parent_indices(vectors),
                    "deleted": pc.invert(pc.list_flatten(vectors)).cast(pa.int64()),
                }
            )
            .group_by("row")
            .aggregate([("deleted", "sum")])
        )
        counts = dict(
            zip(deleted.column("row").to_pylist(), deleted.column("deleted_sum").to_pylist(), strict=True)
        )
        found = {self._rel(p): counts.get(i, 0) for i, p in enumerate(dvs.column("filepath").to_pylist())}
        if found != expected:
            parts = _differences(
                expected,
                found,
                *_DVS_ON_ONE_SIDE,
                lambda n, p: (
                    f"{n} delete a different number of rows (e.g. {p}: store cardinality "
                    f"{expected[p]}, deltalake {found[p]} deleted rows)"
                ),
            )
            self._report(
                "reader_files", version, "; ".join([f"{at}: deletion vectors differ", *parts]), _FILES_HINT
            )


# What only the store (first) or only deltalake (second) has: ``{n}`` of them, e.g. ``{first}``.
_FILES_ON_ONE_SIDE = ("{n} missing from the reader (e.g. {first})", "{n} not in the store (e.g. {first})")
_DVS_ON_ONE_SIDE = (
    "{n} files have one only in the store (e.g. {first})",
    "{n} only in deltalake (e.g. {first})",
)


def _differences(
    expected: Mapping[str, Any],
    found: Mapping[str, Any],
    only_expected: str,
    only_found: str,
    changed: Callable[[int, str], str],
) -> list[str]:
    """What deltalake's view (``found``) and the store's disagree on, a line each: the keys only one
    side has (``only_*``), and the keys both have with different values (``changed(n, first)``)."""
    lines = [
        text.format(n=len(keys), first=keys[0])
        for keys, text in (
            (sorted(expected.keys() - found.keys()), only_expected),
            (sorted(found.keys() - expected.keys()), only_found),
        )
        if keys
    ]
    differing = sorted(p for p in expected.keys() & found.keys() if expected[p] != found[p])
    return [*lines, changed(len(differing), differing[0])] if differing else lines


# -----------------------------------------------------------------------------------------------
# Values: Delta's text encodings vs deltalake's typed values
# -----------------------------------------------------------------------------------------------

_INTS = ("byte", "short", "integer", "long")
_FLOATS = ("float", "double")


def _partition_from_text(typ: Any, text: str | None) -> Any:
    """A partition value from its Delta text form, typed like deltalake returns it.

    An empty string is null for every type (PROTOCOL.md). Text that does not parse is kept as text,
    so a real mismatch still shows.
    """
    if text is None or text == "":
        return None
    t = typ if isinstance(typ, str) else ""
    try:
        if t in _INTS:
            return int(text)
        if t in _FLOATS:
            return float(text)
        if t == "boolean":
            return {"true": True, "false": False}.get(text.lower(), text)
        if t == "date":
            return date.fromisoformat(text)
        if t.startswith("timestamp"):
            return _utc_naive(datetime.fromisoformat(text.replace("Z", "+00:00")))
        if t.startswith("decimal"):
            return Decimal(text).normalize()
    except (ValueError, InvalidOperation):
        return text
    return text


def _partition_from_reader(typ: Any, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, datetime):
        return _utc_naive(value)
    if isinstance(value, Decimal):
        return value.normalize()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str) and typ not in ("string", "binary"):
        return _partition_from_text(typ, value)
    return value


def _utc_naive(value: datetime) -> datetime:
    return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _reraise_interrupts(exc: BaseException) -> None:
    if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
        raise exc


__all__ = ["ReaderCheck", "StoreState"]
