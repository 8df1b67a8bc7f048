"""The file index rule, once: what a version's adds and removes do to ``dl_files``.

- an add makes a new active entry (path, deletion vector id, its position, size, partition values);
- a re-added (path, deletion vector), from version 1 on, supersedes the active entry: it is ended
  at this version with no remove position and no deletion timestamp (recomputed stats, say);
- a remove ends the active entry of its key with its own position and deletion timestamp;
- each key is ended once per version, supersedes first (a key both re-added and removed ends as
  superseded), and the version's adds go in after its ends;
- (imports only) a remove of a key with no active entry, that the version did not end already, is
  kept as a tombstone row, so checkpoints still carry it.

:func:`index_changes` decides it for one version as rows (the one-statement commits send them, the
row writer ``log_rows.write_actions`` runs them); :class:`FileIndex` applies the same rule in
memory to a whole imported log (``bulk_load``), row for row and in the same insertion order.
tests/store/test_commit_differential.py checks the commits' rows against a reference of the rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from delta_mirror.delta.actions import Action
from delta_mirror.delta.line_facts import DV_ID, KIND, PATH, FileAction
from delta_mirror.delta.replay import FileKey, file_key

#: dl_files columns, in the order of ``FileIndex.rows``' lists (``RV``: remove_version's position).
FILE_COLUMNS = (
    "path",
    "dv_id",
    "add_version",
    "add_part",
    "add_seq",
    "remove_version",
    "remove_part",
    "remove_seq",
    "size",
    "partition_values",
    "deletion_timestamp",
)
F_PATH, F_DV, F_AV, F_AP, F_AS, RV, F_RP, F_RS, F_SIZE, F_PV, F_DT = range(len(FILE_COLUMNS))


def whole(body: Mapping[str, Any], field: str) -> int | None:
    """An integer field of an action body as ``dl_files`` stores it (anything else: NULL)."""
    value = body.get(field)
    return value if isinstance(value, int) else None


def file_rows(
    table_id: int, version: int, part: int, actions: Sequence[Action]
) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any]]]]:
    """The ``dl_files`` rows to insert for adds, and (seq, body) of the removes."""
    adds: list[dict[str, Any]] = []
    removes: list[tuple[int, dict[str, Any]]] = []
    for seq, (kind, body) in enumerate(actions):
        if kind == "add":
            pv = body.get("partitionValues")
            key = file_key(body)
            adds.append(
                {
                    "table_id": table_id,
                    "path": key.path,
                    "dv_id": key.dv_id,
                    "add_version": version,
                    "add_part": part,
                    "add_seq": seq,
                    "size": whole(body, "size"),
                    "partition_values": json.dumps(pv, separators=(",", ":"), ensure_ascii=False)
                    if pv is not None
                    else None,
                }
            )
        elif kind == "remove":
            removes.append((seq, body))
    return adds, removes


def index_changes(
    table_id: int, version: int, part: int, actions: Sequence[Action]
) -> tuple[list[dict[str, Any]], list[tuple[str, str, int | None, int | None, int | None]]]:
    """One version's file-index changes under the rule (module docstring): the ``dl_files`` rows
    to insert, and the active entries the version ends as (path, dv_id, remove_part, remove_seq,
    deletion_timestamp), each key once, supersedes (no position) before removes."""
    adds, removes = file_rows(table_id, version, part, actions)
    ends: list[tuple[str, str, int | None, int | None, int | None]] = []
    superseded: set[tuple[str, str]] = set()
    if version > 0:
        for a in adds:
            if (a["path"], a["dv_id"]) not in superseded:
                superseded.add((a["path"], a["dv_id"]))
                ends.append((a["path"], a["dv_id"], None, None, None))
    ended = set(superseded)
    for seq, body in removes:
        key = file_key(body)
        if (key.path, key.dv_id) not in ended:
            ended.add((key.path, key.dv_id))
            ends.append((key.path, key.dv_id, part, seq, whole(body, "deletionTimestamp")))
    return adds, ends


class FileIndex:
    """``dl_files`` of one new table, version by version, under the rule (module docstring) with
    tombstones: an imported table is new, so its whole index is a function of its log and is
    kept in memory (an entry per key, closed ones dropped) rather than read back per version."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []
        self._active: dict[FileKey, list[list[Any]]] = {}
        self._closed: dict[int, set[FileKey]] = {}  # keys whose rows a version closed
        self._early: dict[int, int] = {}  # version -> its adds whose rows ``early`` made

    def early(self, version: int, part: int, adds: Sequence[FileAction]) -> None:
        """Rows for the next adds of ``version`` before its end (a commit that holds adds only):
        an add's row is the same whatever the rest of its version holds, and with no remove there
        is no tombstone to come before it. ``apply`` then takes the decisions, as for any other."""
        for add in adds:
            if add[KIND] != "add":
                raise ValueError(f"version {version}: early file rows must be adds, got {add[KIND]}")
            self.rows.append(_add_row(version, part, add))
        self._early[version] = self._early.get(version, 0) + len(adds)

    def has_early(self, version: int) -> bool:
        return version in self._early

    def apply(self, version: int, part: int, files: Sequence[FileAction]) -> None:
        """The version's file actions; the rows of its first adds may have been made by
        ``early`` (they are then the last rows)."""
        early = self._early.pop(version, 0)
        active = self._active
        adds = [f for f in files if f[KIND] == "add"]
        # (path, deletion vector id) pairs made in C: plain tuples, equal to (and hashed as) the
        # FileKey of the same fields, so either finds the other's entries.
        keys: list[FileKey] = list(map(_KEY_OF, adds))
        if adds and version > 0 and active:
            for key in active.keys() & keys:
                for row in active.pop(key):
                    row[RV] = version
                self._close(version, key)
        if len(adds) != len(files):
            if early:
                raise ValueError(f"version {version}: early file rows, but the version removes files")
            self._remove(version, part, [f for f in files if f[KIND] == "remove"])
        rows = self.rows
        made = rows[len(rows) - early :] if early else []
        new = [_add_row(version, part, add) for add in adds[early:]]
        rows += new
        if (not active or active.keys().isdisjoint(keys)) and len(set(keys)) == len(keys):
            # Every key new and once (a large commit of new files): the entries added in C.
            active.update(zip(keys, map(list, zip(made + new if made else new)), strict=True))
            return
        for key, row in zip(keys, made + new, strict=True):
            same = active.get(key)
            if same is None:
                active[key] = [row]
            else:
                same.append(row)

    def _remove(self, version: int, part: int, removes: Sequence[FileAction]) -> None:
        removed = 0
        for seq, _kind, path, dv, _size, _pv, dt in removes:
            key = FileKey(path, dv)
            rows = self._active.pop(key, None)
            if rows is None:
                continue
            for row in rows:
                row[RV], row[F_RP], row[F_RS], row[F_DT] = version, part, seq, dt
            removed += len(rows)
            self._close(version, key)
        if removed == len(removes):
            return  # the store's UPDATE touched as many rows as there were removes
        known = set(self._closed.get(version, ()))
        for seq, _kind, path, dv, _size, _pv, dt in removes:
            if (key := FileKey(path, dv)) not in known:
                self.rows.append([path, dv, None, None, None, version, part, seq, None, None, dt])
                self._close(version, key)

    def drop(self, version: int, keys: Iterable[FileKey]) -> None:
        """Close the active entries of ``keys`` at ``version`` without a tombstone (a source
        checkpoint no longer lists them)."""
        for key in keys:
            for row in self._active.pop(key, ()):
                row[RV] = version
            self._close(version, key)

    def _close(self, version: int, key: FileKey) -> None:
        self._closed.setdefault(version, set()).add(key)


_KEY_OF = itemgetter(PATH, DV_ID)


def _add_row(version: int, part: int, add: FileAction) -> list[Any]:
    """A new ``dl_files`` row for an add, open (in ``FILE_COLUMNS`` order)."""
    seq, _kind, path, dv, size, pv, _dt = add
    return [path, dv, version, part, seq, None, None, None, size, pv, None]


__all__ = [
    "FILE_COLUMNS",
    "F_AP",
    "F_AS",
    "F_AV",
    "F_DT",
    "F_DV",
    "F_PATH",
    "F_PV",
    "F_RP",
    "F_RS",
    "F_SIZE",
    "RV",
    "FileIndex",
    "file_rows",
    "index_changes",
    "whole",
]
