"""What the source-log tests share: the shared corpus and its index, reading a log, replaying its files.

The corpus (``DELTA_MIRROR_CORPUS``) is read in place and never written into; a test that needs a
modified log (early commits cleaned up, a missing sidecar or part) works on a copy in ``tmp_path``.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from delta_mirror.delta.source_log import SourceLog, read_source_log
from delta_mirror.storage import open_store
from support import builders
from support.services import corpus_path

CORPUS = corpus_path().resolve()
HAVE_CORPUS = (CORPUS / "INDEX.tsv").is_file()
NO_CORPUS = f"shared Delta corpus not found at {CORPUS} (set DELTA_MIRROR_CORPUS)"

CATALOG_MANAGED = "kernel-rs/uc-catalog_managed_0"
MAY_BE_REFUSED = {"kernel-rs/table-with-geo"}
# Logs Delta readers cannot reconstruct at some version (docs/compatibility.md: "Import: logs readers cannot
# reconstruct"): version 0 of the DLT table has a metaData action without schemaString.
UNRECONSTRUCTABLE = {"delta-rs/delta-live-table": "schemaString"}


def _index() -> list[dict[str, str]]:
    if not HAVE_CORPUS:
        return []
    with open(CORPUS / "INDEX.tsv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


INDEX = _index()


def _no_corpus(arity: int = 1) -> list[Any]:
    """One visibly skipped case, so a missing corpus shows up in the summary."""
    return [pytest.param(*([None] * arity), id="no-corpus", marks=pytest.mark.skip(reason=NO_CORPUS))]


def _params(rows: Iterable[dict[str, str]]) -> list[Any]:
    return [pytest.param(r, id=r["path"]) for r in rows] or _no_corpus()


def _read(path: Path, name: str | None = None) -> SourceLog:
    return read_source_log(open_store(str(path)), table=name or path.name)


_COMMIT_RE = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_RE = re.compile(r"^(\d{20})\.checkpoint\.")


def _fs_versions(table_dir: Path) -> tuple[set[int], set[int]]:
    """Commit and checkpoint versions by listing the folder directly (independent of the code)."""
    log = table_dir / "_delta_log"
    commits: set[int] = set()
    checkpoints: set[int] = set()
    if log.is_dir():
        for name in os.listdir(log):
            if m := _COMMIT_RE.match(name):
                commits.add(int(m[1]))
            elif m := _CHECKPOINT_RE.match(name):
                checkpoints.add(int(m[1]))
    return commits, checkpoints


def _dv_id(payload: dict[str, Any]) -> tuple[Any, ...] | None:
    dv = payload.get("deletionVector")
    if not dv:
        return None
    return (dv.get("storageType"), dv.get("pathOrInlineDv"), dv.get("offset"))


def _replay(lines: Iterable[str], active: dict[tuple[str, Any], dict[str, Any]]) -> None:
    """Apply add/remove lines to the active file set, keyed by (path, deletion-vector id)."""
    for line in lines:
        ((kind, payload),) = json.loads(line).items()
        if kind == "add":
            active[(payload["path"], _dv_id(payload))] = payload
        elif kind == "remove":
            active.pop((payload["path"], _dv_id(payload)), None)


def _active_files(log: SourceLog) -> dict[tuple[str, Any], dict[str, Any]]:
    active: dict[tuple[str, Any], dict[str, Any]] = {}
    if log.base_checkpoint is not None:
        _replay(log.base_checkpoint.actions, active)
    for _version, lines, _data in log.commits:
        _replay(lines, active)
    return active


def _deltalake_paths(table_dir: Path) -> set[str]:
    deltalake = pytest.importorskip("deltalake")
    try:
        dt = deltalake.DeltaTable(str(table_dir))
        paths = dt.get_add_actions(flatten=True).column("path").to_pylist()
    except Exception as exc:
        pytest.skip(f"deltalake cannot open {table_dir}: {str(exc)[:200]}")
    return {str(p) for p in paths}


def _protocol(log: SourceLog) -> dict[str, Any]:
    protocol: dict[str, Any] = {}
    lines = list(log.base_checkpoint.actions) if log.base_checkpoint else []
    for _v, commit_lines, _d in log.commits:
        lines.extend(commit_lines)
    for line in lines:
        if line.startswith('{"protocol":'):
            protocol = json.loads(line)["protocol"]
    return protocol


PROTOCOL = builders.PROTOCOL
METADATA = builders.action(
    "metaData",
    builders.metadata_body(
        id="00000000-0000-0000-0000-000000000000",
        schema_string=builders.EMPTY_SCHEMA_STRING,
        partition_columns=["p"],
    ),
)
_write_commit = builders.write_commit
_add = builders.add
