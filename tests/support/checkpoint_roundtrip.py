"""Checkpoint round trips for ``tests/delta/test_checkpoint.py``: replay a real table's JSON commits
into a ``CheckpointInput`` (the SQL store's job in production), publish a built checkpoint into a copy
without the commits it replaces, and what deltalake sees of a table; plus Spark's Murmur3 reference.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder

from delta_mirror.delta.checkpoint import CheckpointInput, CheckpointResult, build_checkpoint
from delta_mirror.delta.log_path import LogFileKind, parse_log_file


def _dv_id(body: dict[str, Any]) -> str | None:
    dv = body.get("deletionVector")
    if not dv:
        return None
    return f"{dv.get('storageType')}{dv.get('pathOrInlineDv')}@{dv.get('offset')}"


@dataclasses.dataclass
class _Replay:
    """A log replayed in order: the last protocol and metaData, live txns and domains, and each file
    (path and deletion vector) as either live (``adds``) or a tombstone (``removes``)."""

    protocol: str = ""
    metadata: str = ""
    txns: dict[str, str] = dataclasses.field(default_factory=dict)
    domains: dict[str, str] = dataclasses.field(default_factory=dict)
    adds: dict[tuple[str, str | None], str] = dataclasses.field(default_factory=dict)
    removes: dict[tuple[str, str | None], str] = dataclasses.field(default_factory=dict)

    def apply(self, kind: str, body: dict[str, Any], line: str) -> None:
        if kind == "protocol":
            self.protocol = line
        elif kind == "metaData":
            self.metadata = line
        elif kind == "txn":
            self.txns[body["appId"]] = line
        elif kind == "domainMetadata":
            if body.get("removed"):
                self.domains.pop(body["domain"], None)
            else:
                self.domains[body["domain"]] = line
        elif kind in ("add", "remove"):
            key = (body["path"], _dv_id(body))
            live, gone = (self.adds, self.removes) if kind == "add" else (self.removes, self.adds)
            live[key] = line
            gone.pop(key, None)


def log_state(table: Path, version: int | None = None) -> CheckpointInput:
    """Reconcile the table's JSON commits up to ``version`` (the SQL store's job in production)."""
    commits = sorted(
        (lf.version, p)
        for p in (table / "_delta_log").iterdir()
        if (lf := parse_log_file(p.name)) is not None and lf.kind == LogFileKind.COMMIT
    )
    if version is None:
        version = commits[-1][0]
    state = _Replay()
    for _, path in (c for c in commits if c[0] <= version):
        for raw in path.read_text(encoding="utf-8").splitlines():
            if raw.strip():
                action = json.loads(raw)
                ((kind, body),) = action.items()
                state.apply(kind, body, json.dumps(action, separators=(",", ":"), ensure_ascii=False))
    return CheckpointInput(
        version=version,
        protocol=state.protocol,
        metadata=state.metadata,
        txns=list(state.txns.values()),
        domain_metadata=list(state.domains.values()),
        adds=list(state.adds.values()),
        removes=list(state.removes.values()),
    )


def publish(table: Path, result: CheckpointResult, version: int, dest: Path) -> Path:
    """Copy ``table`` to ``dest`` without any log file at or before ``version``, then add ours."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        if Path(folder).name == "_sidecars":
            return set(names)  # old sidecars belong to checkpoints we drop
        if Path(folder).name != "_delta_log":
            return set()
        dropped = {"_last_checkpoint"}
        for name in names:
            lf = parse_log_file(name)
            if (lf is not None and lf.kind != LogFileKind.LAST_CHECKPOINT and lf.version <= version) or (
                name.startswith(".") and name.endswith(".crc")
            ):
                dropped.add(name)
        return dropped

    shutil.copytree(table, dest, ignore=ignore, copy_function=shutil.copyfile)
    for folder, _, _ in os.walk(dest):
        os.chmod(folder, 0o755)
    for f in result.files:
        target = dest / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.data)
    (dest / "_delta_log" / "_last_checkpoint").write_bytes(result.last_checkpoint)
    remaining = [p.name for p in (dest / "_delta_log").glob("*.json") if parse_log_file(p.name)]
    assert all(parse_log_file(n).version > version for n in remaining)  # type: ignore[union-attr]
    return dest


def view(table: Path, version: int | None = None, *, read_data: bool = True) -> dict[str, Any]:
    """Everything a reader derives from the log that a checkpoint must preserve."""
    dt = DeltaTable(str(table), version=version)
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    files = sorted(
        (
            a["path"],
            a["size_bytes"],
            tuple(sorted((k, v) for k, v in a.items() if k.startswith("partition."))),
        )
        for a in adds
    )
    dvs = dt.deletion_vectors()
    selection = (
        sorted(
            (r["filepath"].rsplit("/", 1)[-1], tuple(r["selection_vector"]))
            for r in pa.table(dvs).to_pylist()
        )
        if dvs is not None
        else []
    )
    meta = dt.metadata()
    out: dict[str, Any] = {
        "version": dt.version(),
        "protocol": dt.protocol(),
        "metadata": (meta.id, meta.partition_columns, meta.configuration, json.loads(dt.schema().to_json())),
        "files": files,
        "deletion_vectors": selection,
    }
    if read_data:
        rows = QueryBuilder().register("t", dt).execute("select count(*) as n from t").read_all()
        out["rows"] = pa.table(rows).column("n")[0].as_py()
    return out


def roundtrip(table: Path, tmp_path: Path, *, read_data: bool = True, **kwargs: Any) -> CheckpointResult:
    """Build, publish into a copy, and assert deltalake sees the same table."""
    state = log_state(table)
    result = build_checkpoint(state, **kwargs)
    copy = publish(table, result, state.version, tmp_path / f"copy-{kwargs.get('kind', 'classic')}")
    assert view(copy, read_data=read_data) == view(table, state.version, read_data=read_data)
    return result


def rows(data: bytes) -> list[dict[str, Any]]:
    """Non-null actions of a checkpoint file, in file order."""
    table = pq.read_table(pa.BufferReader(data))
    return [{k: v for k, v in r.items() if v is not None} for r in table.to_pylist()]


def spark_murmur3(data: bytes, seed: int = 42) -> int:
    """Reference: Spark's Murmur3_x86_32.hashUnsafeBytes (tail bytes one by one, sign-extended)."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def mix(h: int, k: int) -> int:
        k = rotl((k * 0xCC9E2D51) & mask, 15) * 0x1B873593 & mask
        return (rotl(h ^ k, 13) * 5 + 0xE6546B64) & mask

    h = seed
    aligned = len(data) - len(data) % 4
    for (word,) in struct.iter_unpack("<I", data[:aligned]):
        h = mix(h, word)
    for byte in data[aligned:]:
        h = mix(h, (byte - 256 if byte > 127 else byte) & mask)
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h
