"""An independent checker of the invariants (docs/architecture.md) for one table: it reads
``_delta_log/`` and the SQL store itself.

Nothing here calls the reconciler, the log audit or the publisher: commit files are listed and hashed
directly (the filesystem, or boto3 against the S3 server *behind* the fault proxy), and the store is
read with plain SQL. ``validate`` (the product's own reader check) is one extra check on top.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq
from sqlalchemy import create_engine, text

COMMIT = re.compile(r"^(\d{20})\.json$")
CLASSIC = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
PART = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")


class LogReader(Protocol):
    def names(self) -> list[str]: ...
    def read(self, name: str) -> bytes | None: ...


class LocalLog:
    def __init__(self, root: Path) -> None:
        self.dir = root / "_delta_log"

    def names(self) -> list[str]:
        return sorted(p.name for p in self.dir.iterdir() if p.is_file()) if self.dir.is_dir() else []

    def read(self, name: str) -> bytes | None:
        try:
            return (self.dir / name).read_bytes()
        except FileNotFoundError:
            return None


class S3Log:
    """Reads the bucket directly (boto3 to the real server, never through the proxy)."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client, self.bucket, self.prefix = client, bucket, f"{prefix.strip('/')}/_delta_log/"

    def names(self) -> list[str]:
        out: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix
        ):
            out += [o["Key"][len(self.prefix) :] for o in page.get("Contents", [])]
        return sorted(n for n in out if "/" not in n)

    def read(self, name: str) -> bytes | None:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read())
        except self.client.exceptions.NoSuchKey:
            return None


def log_reader(location: str, s3_client: Any = None) -> LogReader:
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return LocalLog(Path(unquote(parsed.path)))
    return S3Log(s3_client, parsed.netloc, parsed.path)


@dataclass
class Verdict:
    table: str
    committed: int = 0  # versions in the store
    published: int = 0  # of those, present at the location with the recorded SHA-256
    lost: list[int] = field(default_factory=list)
    duplicated: list[int] = field(default_factory=list)
    corrupted: list[int] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # broken invariants (never acceptable)
    unfinished: list[str] = field(default_factory=list)  # not yet recovered (acceptable mid-fault)
    last_checkpoint: int | None = None

    @property
    def safe(self) -> bool:
        """Nothing was broken (it may still be catching up)."""
        return not (self.violations or self.duplicated or self.corrupted)

    @property
    def recovered(self) -> bool:
        return self.safe and not self.lost and not self.unfinished


class StoreReader:
    """Plain SQL on the store's tables."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url, connect_args={"timeout": 60} if url.startswith("sqlite") else {})

    def query(self, sql: str, **params: Any) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(text(sql), params))

    def table(self, name: str) -> Any:
        return self.query("SELECT * FROM dl_tables WHERE name = :n", n=name)[0]

    def close(self) -> None:
        self.engine.dispose()


@dataclass
class _Log:
    """What the checker read from ``_delta_log/``: commit files, their digests, complete checkpoints."""

    names: list[str]
    files: dict[int, str]  # version -> commit file name
    digests: dict[int, str]  # version -> SHA-256 of the commit file
    foreign_versions: set[int]  # versions an external writer put there on purpose
    complete: dict[int, int] = field(default_factory=dict)  # checkpoint version -> rows
    parts: dict[tuple[int, int], dict[int, str]] = field(default_factory=dict)  # (version, of) -> parts


def check_table(
    store: StoreReader,
    name: str,
    log: LogReader,
    *,
    foreign: dict[str, bytes] | None = None,
    status_json: dict[str, Any] | None = None,
) -> Verdict:
    """Every §2 invariant, plus whether the table has fully caught up (``unfinished``).

    ``foreign``: files an external writer put in the log on purpose (they must be left untouched).
    ``status_json``: ``delta-mirror status NAME --json``, checked against what the log holds.
    """
    foreign = foreign or {}
    v = Verdict(name)
    t = store.table(name)
    commits = {
        int(r.version): (r.sha256, bool(r.has_json))
        for r in store.query("SELECT version, sha256, has_json FROM dl_commits WHERE table_id = :t", t=t.id)
    }
    status = store.query(
        "SELECT version, artifact, state, sha256 FROM dl_mirror_status WHERE table_id = :t", t=t.id
    )
    v.committed = len(commits)
    names = log.names()
    files = {int(m[1]): n for n in names if (m := COMMIT.match(n))}
    digests = {ver: hashlib.sha256(log.read(n) or b"").hexdigest() for ver, n in files.items()}
    for fname, content in foreign.items():
        if log.read(fname) != content:
            v.violations.append(f"the external writer's {fname} was overwritten or removed")
    seen = _Log(names, files, digests, {int(m[1]) for n in foreign if (m := COMMIT.match(n))})

    _check_order(v, seen, t.first_version)
    _check_commits(v, seen, commits)
    _read_checkpoints(v, seen, log)
    _check_last_checkpoint(v, seen, log, status)
    _check_status_rows(v, seen, status)
    if t.state != "ACTIVE":
        v.unfinished.append(f"table is {t.state}: {t.halted_reason}")
    if v.lost:
        v.unfinished.append(f"{len(v.lost)} committed version(s) not published yet")
    if status_json is not None:
        _check_status(v, status_json, files, digests, commits, t.state)
    return v


def _check_order(v: Verdict, seen: _Log, first_version: int) -> None:
    """1. In order, no gaps, starting at the table's first version."""
    if not seen.files:
        return
    lo, hi = min(seen.files), max(seen.files)
    gaps = sorted(set(range(lo, hi + 1)) - set(seen.files))
    if gaps:
        v.violations.append(f"gap in the log at versions {gaps[:10]}")
    if lo != first_version:
        v.violations.append(f"the log starts at {lo}, not {first_version}")


def _check_commits(v: Verdict, seen: _Log, commits: dict[int, tuple[str, bool]]) -> None:
    """2-3. Every committed version once, with its recorded bytes; nothing beyond the store."""
    for ver, (sha, has_json) in sorted(commits.items()):
        if not has_json:
            continue
        if ver not in seen.files:
            v.lost.append(ver)
        elif ver in seen.foreign_versions:
            pass  # the conflict the external writer caused: reported by the scenario
        elif seen.digests[ver] != sha:
            v.corrupted.append(ver)
        else:
            v.published += 1
    latest = max(commits, default=-1)
    v.duplicated += [ver for ver in seen.files if ver > latest and ver not in seen.foreign_versions]
    by_digest: dict[str, list[int]] = defaultdict(list)
    for ver, d in seen.digests.items():
        by_digest[d].append(ver)
    v.duplicated += [ver for vs in by_digest.values() if len(vs) > 1 for ver in sorted(vs)[1:]]


def _read_checkpoints(v: Verdict, seen: _Log, log: LogReader) -> None:
    """4a. Complete checkpoints (classic, or every part of a multi-part one) follow their commits."""
    parts: dict[tuple[int, int], dict[int, str]] = defaultdict(dict)
    for n in seen.names:
        if m := CLASSIC.match(n):
            seen.complete[int(m[1])] = _rows(log, [n], v)
        elif m := PART.match(n):
            parts[(int(m[1]), int(m[3]))][int(m[2])] = n
    for (ver, total), got in parts.items():
        if len(got) == total:
            seen.complete[ver] = _rows(log, [got[i] for i in sorted(got)], v)
    seen.parts = dict(parts)
    for ver in {*seen.complete, *(k[0] for k in parts)}:
        if ver not in seen.files:
            v.violations.append(f"checkpoint {ver} without its commit")


def _check_last_checkpoint(v: Verdict, seen: _Log, log: LogReader, status: list[Any]) -> None:
    """4b. ``_last_checkpoint`` points at a complete checkpoint, never behind a SUCCESS one."""
    raw = log.read("_last_checkpoint")
    if raw is not None:
        try:
            _judge_pointer(v, seen, json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            v.violations.append(f"_last_checkpoint is invalid: {exc!r}")
    newest = max(
        (r.version for r in status if r.artifact == "checkpoint" and r.state == "SUCCESS"), default=None
    )
    if newest is not None and (v.last_checkpoint is None or v.last_checkpoint < newest):
        # SUCCESS is recorded after the pointer is written, so this holds at every instant.
        v.violations.append(f"_last_checkpoint ({v.last_checkpoint}) is behind checkpoint {newest} (SUCCESS)")


def _judge_pointer(v: Verdict, seen: _Log, pointer: dict[str, Any]) -> None:
    v.last_checkpoint = int(pointer["version"])
    if pointer.get("parts") == 1:
        v.violations.append('_last_checkpoint has "parts": 1')
    if v.last_checkpoint not in seen.complete:
        v.violations.append(f"_last_checkpoint points at {v.last_checkpoint}, not a complete checkpoint")
    elif int(pointer["size"]) != seen.complete[v.last_checkpoint]:
        v.violations.append(
            f"_last_checkpoint size {pointer['size']} != {seen.complete[v.last_checkpoint]} checkpoint rows"
        )
    elif pointer.get("parts") is not None and (v.last_checkpoint, int(pointer["parts"])) not in seen.parts:
        v.violations.append(f"_last_checkpoint parts {pointer['parts']} do not match the files")


def _check_status_rows(v: Verdict, seen: _Log, status: list[Any]) -> None:
    """5. Status tells the truth (at any time); what is not SUCCESS yet is unfinished."""
    for r in status:
        if r.state != "SUCCESS":
            v.unfinished.append(f"{r.artifact} {r.version} is {r.state}")
        elif r.artifact == "json":
            if r.version not in seen.files:
                v.violations.append(f"status says {r.version}.json is SUCCESS but it is not there")
            elif r.version not in seen.foreign_versions and seen.digests[r.version] != r.sha256:
                v.violations.append(f"status SUCCESS for {r.version}.json with a hash that is not the file's")
        elif r.artifact == "checkpoint" and r.version not in seen.complete:
            v.violations.append(f"status says checkpoint {r.version} is SUCCESS but it is incomplete")


def _rows(log: LogReader, names: list[str], v: Verdict) -> int:
    rows = 0
    for n in names:
        try:
            rows += pq.ParquetFile(io.BytesIO(log.read(n) or b"")).metadata.num_rows
        except Exception as exc:
            v.violations.append(f"checkpoint file {n} is unreadable: {exc!r}")
    return rows


def _check_status(
    v: Verdict,
    st: dict[str, Any],
    files: dict[int, str],
    digests: dict[int, str],
    commits: dict[int, tuple[str, bool]],
    state: str,
) -> None:
    contiguous = None
    ver = min(commits, default=0)
    while ver in files and digests[ver] == commits[ver][0]:
        contiguous = ver
        ver += 1
    if st["latest_committed"] != max(commits, default=None):
        v.violations.append(f"status latest_committed {st['latest_committed']} != store {max(commits)}")
    if st["last_published"] is not None and (contiguous is None or st["last_published"] > contiguous):
        v.violations.append(
            f"status claims published through {st['last_published']}, the log has {contiguous}"
        )
    if st["state"] != state:
        v.violations.append(f"status state {st['state']} != {state}")
    if st["last_published"] != st["latest_committed"] or st["pending"] or st["failed"] or st["conflicts"]:
        v.unfinished.append(
            f"status: published {st['last_published']} of {st['latest_committed']}, "
            f"pending {st['pending']}, failed {st['failed']}, conflicts {st['conflicts']}"
        )


__all__ = ["LocalLog", "S3Log", "StoreReader", "Verdict", "check_table", "log_reader"]
