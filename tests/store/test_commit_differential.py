"""The claim rule, differentially: the same seeded random commit sequences on every backend,
each outcome and every stored row compared with a reference written once, here, in Python.

Why: each database writes a commit its own way (PostgreSQL's one statement, SQLite's short
transaction, the SQLAlchemy transaction on MySQL and DuckDB) and each has a cache of what a table
looks like; they must agree on who may claim which version and on the rows a commit leaves. Two
``SqlStore`` objects on one database play two service processes, so either one's cache can be
stale (the other committed, halted, or dropped and re-created the table).

``DELTA_MIRROR_DIFF_SEEDS=N`` runs seeds 0..N-1 (default: three seeds), ``DELTA_MIRROR_DIFF_OPS``
the commits per seed (default 40).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import select
from store.store_kit import Action, add, inline_dv, metadata, protocol, remove, spark_file
from support.race import race

from delta_mirror.delta.actions import render_commit
from delta_mirror.delta.replay import file_key
from delta_mirror.errors import (
    CommitConflictError,
    InvalidActionError,
    MirrorError,
    TableHaltedError,
    VersionGapError,
)
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import (
    PART_COMMIT,
    dl_actions,
    dl_commits,
    dl_files,
    dl_mirror_status,
    dl_tables,
)

#: The default seeds reach every outcome of the rule (checked, so the comparison is not vacuous).
DEFAULT_SEEDS = [8, 11, 13]
SEEDS = (
    list(range(int(os.environ["DELTA_MIRROR_DIFF_SEEDS"])))
    if "DELTA_MIRROR_DIFF_SEEDS" in os.environ
    else DEFAULT_SEEDS
)
OUTCOMES = (
    "created",
    "existing",
    "CommitConflictError",
    "InvalidActionError",
    "TableHaltedError",
    "VersionGapError",
)
OPS = int(os.environ.get("DELTA_MIRROR_DIFF_OPS", "40"))
TABLES = ("t0", "t1")


# -- the reference -----------------------------------------------------------------------------


@dataclass
class Entry:
    """One ``dl_files`` row as the reference keeps it."""

    path: str
    dv_id: str
    add_version: int | None
    add_seq: int | None
    size: int | None
    partition_values: str | None
    remove_version: int | None = None
    remove_part: int | None = None
    remove_seq: int | None = None
    deletion_timestamp: int | None = None

    def row(self) -> tuple[Any, ...]:
        return (
            self.path,
            self.dv_id,
            self.add_version,
            PART_COMMIT if self.add_version is not None else None,
            self.add_seq,
            self.remove_version,
            self.remove_part,
            self.remove_seq,
            self.size,
            self.partition_values,
            self.deletion_timestamp,
        )


@dataclass
class RefTable:
    name: str
    location: str
    state: str = "ACTIVE"
    halted_reason: str | None = None
    halted_version: int | None = None
    commits: dict[int, tuple[str, list[str], bytes]] = field(default_factory=dict)  # source, lines, bytes
    files: list[Entry] = field(default_factory=list)
    protocol: dict[str, Any] | None = None

    @property
    def next_version(self) -> int:
        return max(self.commits, default=-1) + 1

    def active(self) -> dict[tuple[str, str], Entry]:
        return {(e.path, e.dv_id): e for e in self.files if e.remove_version is None}


def _whole(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    return value if isinstance(value, int) else None


class Reference:
    """The claim rule and the rows of a commit, once: a halted table refuses first; then a taken
    version is a conflict (a verbatim retry of the same bytes: ``existing``), a later one a gap;
    then the Delta rules the claim relies on (removed files active, no protocol downgrade); then the
    rows: the actions as stored, the file index (a re-add supersedes its active entry with no remove
    position, a remove ends it with its own, each key once per version, adds inserted after), one
    ``PENDING`` json status row."""

    def __init__(self) -> None:
        self.tables: dict[str, RefTable] = {}

    def expect(
        self, name: str, kind: str, version: int, actions: list[Action], data: bytes | None
    ) -> tuple[str, ...]:
        t = self.tables[name]
        nxt = t.next_version
        if t.state == "HALTED":
            return _refusal(
                TableHaltedError(
                    f"the table is halted at version {t.halted_version}: {t.halted_reason}",
                    table=name,
                    version=version,
                    hint=f"fix the cause, then `delta-mirror resume {name}`",
                )
            )
        if version < nxt:
            if kind == "verbatim" and data is not None and t.commits[version][2] == data:
                return ("existing", str(version))
            hint = (
                f"commit as version {nxt}"
                if kind == "native"
                else f"re-read the log and commit as version {nxt}"
            )
            return _refusal(
                CommitConflictError(
                    f"version {version} is already committed (latest is {nxt - 1})",
                    table=name,
                    version=version,
                    hint=hint,
                )
            )
        if version > nxt:
            if kind == "native":
                what, hint = (
                    f"version gap: the next version is {nxt}, not {version}",
                    ("versions must be contiguous; omit the expected version"),
                )
            else:
                what = (
                    f"version gap: the store's next version is {nxt}, not {version}; a writer may have"
                    f" written _delta_log/{version - 1:020d}.json outside the authority"
                )
                hint = f"run `delta-mirror reconcile {name} --strategy full`"
            return _refusal(VersionGapError(what, next_version=nxt, table=name, version=version, hint=hint))
        proto = next((b for k, b in actions if k == "protocol"), None)
        if proto is not None and t.protocol is not None:
            for key in ("minReaderVersion", "minWriterVersion"):
                if proto[key] < t.protocol[key]:
                    return _refusal(
                        InvalidActionError(
                            f"protocol downgrade: {key} {t.protocol[key]} -> {proto[key]}",
                            table=name,
                            version=version,
                            hint="protocols only go up; a feature is removed with a commitInfo operation"
                            " 'DROP FEATURE'",
                        )
                    )
        active = t.active()
        for k, b in actions:
            fkey = file_key(b)
            if k == "remove" and fkey not in active:
                what = f"remove of '{fkey.path}'" + (f" (deletion vector {fkey.dv_id})" if fkey.dv_id else "")
                return _refusal(
                    InvalidActionError(
                        what + " which is not an active file",
                        table=name,
                        version=version,
                        hint="remove only files that are in the table (same path text and deletion vector)",
                    )
                )
        return ("created", str(version))

    def apply(
        self, name: str, kind: str, version: int, stored: list[tuple[str, dict[str, Any]]], data: bytes
    ) -> None:
        """Record a created commit: ``stored``, its actions as the store keeps them (positions = seq)."""
        t = self.tables[name]
        lines = [line for line in data.decode().splitlines()]
        t.commits[version] = (kind, lines, data)
        ended: set[tuple[str, str]] = set()
        active = t.active()
        adds = [(seq, b) for seq, (k, b) in enumerate(stored) if k == "add"]
        if version > 0:
            for _, b in adds:
                key = (file_key(b).path, file_key(b).dv_id)
                if key in active and key not in ended:
                    entry = active[key]
                    entry.remove_version = version
                ended.add(key)
        for seq, (k, b) in enumerate(stored):
            key = (file_key(b).path, file_key(b).dv_id)
            if k == "remove" and key not in ended:
                ended.add(key)
                entry = active[key]
                entry.remove_version, entry.remove_part, entry.remove_seq = version, PART_COMMIT, seq
                entry.deletion_timestamp = _whole(b, "deletionTimestamp")
        for seq, b in adds:
            key = file_key(b)
            pv = b.get("partitionValues")
            t.files.append(
                Entry(
                    key.path,
                    key.dv_id,
                    version,
                    seq,
                    _whole(b, "size"),
                    None if pv is None else json.dumps(pv, separators=(",", ":"), ensure_ascii=False),
                )
            )
        proto = next((b for k, b in stored if k == "protocol"), None)
        if proto is not None:
            t.protocol = proto

    def rows(self, name: str) -> dict[str, Any]:
        t = self.tables[name]
        commits = []
        actions = []
        for v in sorted(t.commits):
            source, lines, data = t.commits[v]
            sized = (len(data), hashlib.sha256(data).hexdigest()) if source == "spark" else None
            commits.append((v, None, len(lines), sized, True, source))
            actions += [
                (v, PART_COMMIT, seq, _kind(line), _masked(line, source)) for seq, line in enumerate(lines)
            ]
        return {
            "table": (t.name, t.location, t.state, t.halted_reason, t.halted_version, 0),
            "commits": commits,
            "actions": actions,
            "files": sorted((e.row() for e in t.files), key=repr),
            "status": [(v, "json", "PENDING", 0) for v in sorted(t.commits)],
        }


def _refusal(exc: MirrorError) -> tuple[str, ...]:
    return (type(exc).__name__, str(exc))


def _kind(line: str) -> str:
    return str(next(iter(json.loads(line))))


def _masked(line: str, source: str) -> str:
    """A native commitInfo's clock and random fields left out (the store writes them)."""
    if source != "native" or _kind(line) != "commitInfo":
        return line
    body = json.loads(line)["commitInfo"]
    return json.dumps({k: v for k, v in body.items() if k not in ("timestamp", "txnId")})


# -- the stored rows -------------------------------------------------------------------------------


def stored_rows(store: SqlStore, name: str) -> dict[str, Any]:
    """The rows a table's commits left, normalized like ``Reference.rows`` (a native commit's size
    and hash are checked against its stored lines here, then left out: its commitInfo has a clock)."""
    with store.engine.connect() as conn:
        t = conn.execute(select(dl_tables).where(dl_tables.c.name == name)).one()
        tid = t.id
        lines: dict[int, list[str]] = {}
        actions = []
        for r in conn.execute(
            select(dl_actions)
            .where(dl_actions.c.table_id == tid)
            .order_by(dl_actions.c.version, dl_actions.c.seq)
        ):
            lines.setdefault(r.version, []).append(r.payload)
            actions.append((r.version, r.part, r.seq, r.action_type, r.payload))
        commits = []
        sources = {}
        for r in conn.execute(
            select(dl_commits).where(dl_commits.c.table_id == tid).order_by(dl_commits.c.version)
        ):
            sources[r.version] = r.source
            data = render_commit(lines.get(r.version, []))
            assert (r.size_bytes, r.sha256) == (len(data), hashlib.sha256(data).hexdigest()), r.version
            sized = (r.size_bytes, r.sha256) if r.source == "spark" else None
            commits.append(
                (r.version, r.in_commit_timestamp, r.action_count, sized, bool(r.has_json), r.source)
            )
        files = [
            (
                f.path,
                f.dv_id,
                f.add_version,
                f.add_part,
                f.add_seq,
                f.remove_version,
                f.remove_part,
                f.remove_seq,
                f.size,
                f.partition_values,
                f.deletion_timestamp,
            )
            for f in conn.execute(select(dl_files).where(dl_files.c.table_id == tid))
        ]
        status = [
            (r.version, r.artifact, r.state, r.attempts)
            for r in conn.execute(
                select(dl_mirror_status)
                .where(dl_mirror_status.c.table_id == tid)
                .order_by(dl_mirror_status.c.version)
            )
        ]
    return {
        "table": (t.name, t.location, t.state, t.halted_reason, t.halted_version, t.first_version),
        "commits": commits,
        "actions": [(v, p, s, k, _masked(line, sources[v])) for v, p, s, k, line in actions],
        "files": sorted(files, key=repr),
        "status": status,
    }


# -- the random sequence -----------------------------------------------------------------------------


class World:
    """Two stores on one database (two processes' caches), the reference, the outcomes so far."""

    def __init__(self, url: str, root: str, seed: int) -> None:
        self.stores = [SqlStore(url), SqlStore(url)]
        self.root = root
        self.rng = random.Random(seed)
        self.ref = Reference()
        self.outcomes: list[tuple[str, ...]] = []
        self.expected: list[tuple[str, ...]] = []
        self.serial = 0

    def close(self) -> None:
        for s in self.stores:
            s.close()

    def store(self) -> SqlStore:
        return self.rng.choice(self.stores)

    def fresh(self) -> str:
        self.serial += 1
        return f"f{self.serial}.parquet"

    def create(self, name: str) -> None:
        location = f"{self.root}/{name}"
        self.store().create_table(name, location)
        self.ref.tables[name] = RefTable(name, location)
        self.commit(name, "native", 0, [protocol(), metadata(), add(self.fresh())])

    # one commit, its outcome and the reference's ---------------------------------------------
    def commit(
        self,
        name: str,
        kind: str,
        version: int,
        actions: list[Action],
        *,
        data: bytes | None = None,
        store: SqlStore | None = None,
    ) -> None:
        if kind == "verbatim" and data is None:
            data = spark_file(*actions)
        expected = self.ref.expect(name, kind, version, actions, data)
        got, stored, body = self.attempt(store or self.store(), name, kind, version, actions, data)
        self.expected.append((name, kind, *expected))
        self.outcomes.append((name, kind, *got))
        if got[0] == "created" and expected[0] == "created":
            self.ref.apply(name, "spark" if kind == "verbatim" else "native", version, stored, body)

    def attempt(
        self, store: SqlStore, name: str, kind: str, version: int, actions: list[Action], data: bytes | None
    ) -> tuple[tuple[str, ...], list[Action], bytes]:
        """Run one commit: its outcome, and when created the actions and bytes as stored."""
        try:
            if kind == "native":
                v = store.commit(name, actions, expected_version=version)
                body = store.commit_bytes(store.get_table(name).id, v)
                stored = [next(iter(json.loads(line).items())) for line in body.decode().splitlines()]
                return ("created", str(v)), stored, body
            assert data is not None
            result = store.commit_verbatim(self.ref.tables[name].location, version, data)
            outcome = ("existing" if result.existing else "created", str(result.version))
            return (
                outcome,
                [next(iter(json.loads(line).items())) for line in data.decode().splitlines()],
                data,
            )
        except MirrorError as exc:
            return _refusal(exc), [], b""

    # the kinds of step ------------------------------------------------------------------------------
    def step(self) -> None:
        rng = self.rng
        name = rng.choice(TABLES)
        t = self.ref.tables[name]
        kind = rng.choice(("native", "verbatim"))
        nxt = t.next_version
        roll = rng.random()
        if roll < 0.30:
            adds = [self._add(rng) for _ in range(rng.randint(1, 3))]
            self.commit(name, kind, nxt, adds)
        elif roll < 0.60:
            self.commit(name, kind, nxt, self._file_change(roll, sorted(t.active())))
        elif roll < 0.66:
            writer = (t.protocol or {}).get("minWriterVersion", 2) + rng.choice((-1, 0, 1))
            self.commit(name, kind, nxt, [protocol(minWriterVersion=max(1, min(writer, 5)))])
        elif roll < 0.71:
            self.commit(
                name,
                kind,
                nxt,
                [metadata(**{"delta.logRetentionDuration": f"interval {rng.randint(1, 30)} days"})],
            )
        elif roll < 0.78 and nxt > 0:
            taken = rng.randrange(nxt)  # a taken version: other bytes, or (verbatim) a retry of its own
            source, _, data = t.commits[taken]
            if kind == "verbatim" and source == "spark" and rng.random() < 0.5:
                self.commit(name, kind, taken, [], data=data)
            else:
                self.commit(name, kind, taken, [self._add(rng)])
        elif roll < 0.83:
            self.commit(name, kind, nxt + rng.randint(1, 3), [self._add(rng)])  # a gap
        elif roll < 0.88:
            self.halt_or_resume(name)
        elif roll < 0.96:
            self.race(name)
        else:
            self.recreate()

    def _file_change(self, roll: float, active: list[tuple[str, str]]) -> list[Action]:
        """A remove, a deletion vector update or a re-add of an active file, else a remove of a
        file that is not active."""
        rng = self.rng
        if roll < 0.42 and active:
            path, dv = rng.choice(active)
            gone = remove(path, dv=self._dv(dv))
            return [gone, *([add(self.fresh())] if rng.random() < 0.5 else [])]
        if roll < 0.50 and active:
            path, dv = rng.choice(active)
            new_dv = inline_dv(rng.randint(1, 9))
            same = file_key(add(path, dv=new_dv)[1]).dv_id == dv
            return [*([] if same else [remove(path, dv=self._dv(dv))]), add(path, dv=new_dv)]
        if roll < 0.55 and active:
            path, dv = rng.choice(active)  # a re-add supersedes the active entry
            return [add(path, size=rng.randint(2, 99), dv=self._dv(dv))]
        return [remove(f"gone-{rng.randint(0, 9)}.parquet")]

    def _add(self, rng: random.Random) -> Action:
        if rng.random() < 0.3:
            part = rng.choice(("1", "2", None))
            return add(f"p={part}/{self.fresh()}", partitionValues={"p": part})
        if rng.random() < 0.2:
            return add(self.fresh(), dv=inline_dv(rng.randint(1, 9)))
        return add(self.fresh(), size=rng.randint(1, 999))

    @staticmethod
    def _dv(dv_id: str) -> dict[str, Any] | None:
        return None if not dv_id else inline_dv(int(dv_id.split("dv")[-1]))

    def halt_or_resume(self, name: str) -> None:
        t = self.ref.tables[name]
        table = self.store().get_table(name)
        if t.state == "HALTED":
            self.store().resume_table(table.id)
            t.state, t.halted_reason, t.halted_version = "ACTIVE", None, None
        else:
            at = max(t.next_version - 1, 0)
            self.store().halt_table(table.id, f"halted by seed step {len(self.outcomes)}", at)
            t.state, t.halted_reason, t.halted_version = (
                "HALTED",
                f"halted by seed step {len(self.outcomes)}",
                at,
            )

    def race(self, name: str) -> None:
        """Two writers (one per store) claim one version with different commits of one kind:
        exactly one wins (a halted table refuses both)."""
        t = self.ref.tables[name]
        v = t.next_version
        kinds = [self.rng.choice(("native", "verbatim"))] * 2
        path = self.fresh()  # one file, two sizes: the sequence goes on alike whoever wins
        commits = [[add(path, size=1)], [add(path, size=2)]]
        datas = [spark_file(*c) if k == "verbatim" else None for k, c in zip(kinds, commits, strict=True)]

        def work(w: int, barrier: threading.Barrier) -> tuple[tuple[str, ...], list[Action], bytes]:
            barrier.wait()
            return self.attempt(self.stores[w], name, kinds[w], v, commits[w], datas[w])

        results = race(2, work)
        if t.state == "HALTED":
            expected = [self.ref.expect(name, kinds[w], v, commits[w], datas[w]) for w in range(2)]
            got = [r[0] for r in results]
        else:  # the loser's message says where it lost (before or at the claim): its class counts
            expected = [("CommitConflictError",), ("created",)]
            got = sorted(r[0][:1] for r in results)
        self.expected.append((name, "race", *map(str, expected)))
        self.outcomes.append((name, "race", *map(str, got)))
        won = [w for w, (outcome, _, _) in enumerate(results) if outcome[0] == "created"]
        if len(won) == 1 and t.state != "HALTED":
            _, stored, body = results[won[0]]
            self.ref.apply(name, "spark" if kinds[won[0]] == "verbatim" else "native", v, stored, body)

    def recreate(self) -> None:
        """Drop the newest table and create it again at the same root under the same name, up to
        the version another store last saw: that store's cache (the old table's id, which SQLite
        gives the new one, its latest version and protocol) is stale but matches on all of them.
        Its next commit, a protocol below the new table's, must still be refused as a downgrade."""
        rng = self.rng
        stale, fresh = rng.sample(self.stores, 2)
        name = max(TABLES, key=lambda n: fresh.get_table(n).id)
        t = self.ref.tables[name]
        if t.state == "HALTED":
            self.halt_or_resume(name)
        kind = rng.choice(("native", "verbatim"))
        writer = (t.protocol or {}).get("minWriterVersion", 2)
        self.commit(name, kind, t.next_version, [protocol(minWriterVersion=writer)], store=stale)
        self.commit(name, kind, t.next_version, [add(self.fresh())], store=stale)
        latest = t.next_version - 1
        fresh.delete_table(fresh.get_table(name).id)
        location = t.location
        fresh.create_table(name, location)
        self.ref.tables[name] = RefTable(name, location)
        self.commit(
            name, "native", 0, [protocol(minWriterVersion=5), metadata(), add(self.fresh())], store=fresh
        )
        while self.ref.tables[name].next_version <= latest:
            self.commit(name, "native", self.ref.tables[name].next_version, [add(self.fresh())], store=fresh)
        self.commit(name, kind, latest + 1, [protocol(minWriterVersion=3)], store=stale)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_backend_claims_and_writes_as_the_reference(store_url: str, tmp_path: Any, seed: int) -> None:
    SqlStore(store_url).init()
    world = World(store_url, (tmp_path / "tables").as_uri(), seed)
    try:
        for name in TABLES:
            world.create(name)
        for _ in range(OPS):
            world.step()
        for i, (got, want) in enumerate(zip(world.outcomes, world.expected, strict=True)):
            assert got == want, f"step {i} of seed {seed}"
        seen = repr(world.outcomes)
        assert seed not in DEFAULT_SEEDS or all(o in seen for o in OUTCOMES)
        reader = world.stores[0]
        for name in TABLES:
            assert stored_rows(reader, name) == world.ref.rows(name), name
    finally:
        world.close()
