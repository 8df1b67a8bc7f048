"""Validation, part 1: the ``_delta_log/`` listing against the store (missing, foreign and
changed commits; incomplete checkpoints; a bad ``_last_checkpoint``)."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

from delta_mirror.delta.last_checkpoint import LAST_CHECKPOINT_PATH, judge_last_checkpoint
from delta_mirror.delta.log_listing import LogListing, list_log, sidecar_refs
from delta_mirror.delta.log_path import LOG_DIR, LogFileKind
from delta_mirror.jobs.validate.report import Problem, version_runs
from delta_mirror.storage import ObjectStore
from delta_mirror.store.sql_store import SqlStore, TableInfo
from delta_mirror.store.states import Artifact, PublishState

_FETCH_WORKERS = 8


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_listing(
    store: SqlStore,
    table: TableInfo,
    objects: ObjectStore,
    lo: int,
    hi: int,
    last_published: int,
    problems: list[Problem],
) -> set[int]:
    """Compare the listing with the store; returns the versions in range with a complete checkpoint."""
    listing = list_log(objects)
    refs = sidecar_refs(objects)
    latest = store.latest_version(table.id)
    latest = last_published if latest is None else latest
    commits = {v: path.rsplit("/", 1)[-1] for v, path in listing.commits.items()}
    _check_published_commits(store, table, objects, commits, lo, hi, problems)
    _check_unpublished_commits(store, table, objects, commits, last_published, latest, problems)
    _check_foreign_files(listing, commits, last_published, latest, problems)
    complete = {
        v for v in listing.checkpoints if lo <= v <= hi and listing.complete_checkpoint(v, refs) is not None
    }
    _check_recorded_checkpoints(store, table, listing, complete, lo, hi, problems)
    _check_last_checkpoint_pointer(store, table, objects, listing, last_published, problems)
    return complete


def _check_published_commits(
    store: SqlStore,
    table: TableInfo,
    objects: ObjectStore,
    commits: dict[int, str],
    lo: int,
    hi: int,
    problems: list[Problem],
) -> None:
    """Published commits in range: present, with the bytes that were published (or adopted)."""
    rows = store.commit_rows(table.id, lo, hi)
    status = {
        s.version: s for s in store.status_rows(table.id, Artifact.JSON, from_version=lo, to_version=hi)
    }
    expected: dict[int, str] = {}
    missing: list[int] = []
    for row in rows:
        if not row.has_json:
            continue
        st = status.get(row.version)
        expected[row.version] = (
            st.sha256 if st is not None and st.state == PublishState.SUCCESS and st.sha256 else row.sha256
        )
        if row.version not in commits:
            missing.append(row.version)
    for first, last in version_runs(missing):
        what = (
            f"{LOG_DIR}/{first:020d}.json is missing although version {first} is published"
            if first == last
            else f"the commit files of versions {first}..{last} are missing although they are published"
        )
        problems.append(
            Problem(
                "missing_commit",
                first,
                what,
                "the file was deleted (by hand or by a too aggressive log cleanup) and readers now see a gap or "
                "fail; restore it from a backup, or set the version's json status back to PENDING and run "
                f"`delta-mirror mirror {table.name}`, which rewrites the identical bytes",
            )
        )
    present = sorted(v for v in expected if v in commits)
    for version, found in zip(present, _fetch_hashes(objects, [commits[v] for v in present]), strict=True):
        if found is None:
            continue  # deleted between list and get: the next run reports it as missing
        if found != expected[version]:
            problems.append(
                Problem(
                    "hash_mismatch",
                    version,
                    f"{LOG_DIR}/{commits[version]} has sha256 {found}, the store recorded {expected[version]}",
                    "the commit file was replaced after publishing (never-overwrite was bypassed: a manual copy, "
                    "another writer or a restore from an older backup) and readers may see other data than SQL. "
                    "Find out who wrote it; if SQL is right, put back the bytes rendered from SQL "
                    "(SqlStore.commit_bytes)",
                )
            )


def _check_unpublished_commits(
    store: SqlStore,
    table: TableInfo,
    objects: ObjectStore,
    commits: dict[int, str],
    last_published: int,
    latest: int,
    problems: list[Problem],
) -> None:
    """Versions the store knows but has not published: a file there must be our own canonical bytes."""
    pending = [
        s
        for s in store.status_rows(table.id, Artifact.JSON, from_version=last_published + 1)
        if s.state != PublishState.SUCCESS and s.version in commits
    ]
    canonical = {r.version: r.sha256 for r in store.commit_rows(table.id, last_published + 1, latest)}
    pending = [s for s in pending if s.version in canonical]
    for st, found in zip(pending, _fetch_hashes(objects, [commits[s.version] for s in pending]), strict=True):
        if found is not None and found != canonical[st.version]:
            problems.append(
                Problem(
                    "external_commit",
                    st.version,
                    f"{LOG_DIR}/{commits[st.version]} exists with sha256 {found} while the store's version "
                    f"{st.version} (status {st.state}) renders to sha256 {canonical[st.version]}",
                    "another writer committed to this log directly; publishing will stop with a CONFLICT. Import "
                    "or discard the foreign commit, then `delta-mirror resume` the table",
                )
            )


def _check_foreign_files(
    listing: LogListing, commits: dict[int, str], last_published: int, latest: int, problems: list[Problem]
) -> None:
    """Commits, checkpoints, ``.crc`` and compacted files at versions the store does not know."""
    for first, last in version_runs(sorted(v for v in commits if v > latest)):
        what = (
            f"{LOG_DIR}/{commits[first]} exists"
            if first == last
            else f"the commit files of versions {first}..{last} exist"
        )
        problems.append(
            Problem(
                "external_commit",
                first,
                f"{what} but the store's latest version is {latest}",
                "another writer (Spark, delta-rs...) committed to the published log instead of through the "
                "store; readers now see versions SQL does not have. Stop that writer, then import its "
                "commits or delete them, before publishing again",
            )
        )
    for name, f in sorted(listing.files.items()):
        if f.kind is LogFileKind.COMMIT:
            continue
        if f.is_checkpoint and f.version > last_published:
            problems.append(
                Problem(
                    "unknown_file",
                    f.version,
                    f"checkpoint file {LOG_DIR}/{name} is at version {f.version}, after the last published "
                    f"version {last_published}",
                    "another writer created it (the mirror only checkpoints published versions); readers may "
                    "load it. Remove it once you know who wrote it",
                )
            )
        elif (
            f.kind in (LogFileKind.CRC, LogFileKind.COMPACTED) and max(f.version, f.end_version or 0) > latest
        ):
            problems.append(
                Problem(
                    "unknown_file",
                    f.version,
                    f"{LOG_DIR}/{name} covers versions the store does not have (latest {latest})",
                    "another writer created it; Spark trusts .crc and .compacted.json files blindly, so remove it",
                )
            )


def _check_recorded_checkpoints(
    store: SqlStore,
    table: TableInfo,
    listing: LogListing,
    complete: set[int],
    lo: int,
    hi: int,
    problems: list[Problem],
) -> None:
    """Every checkpoint the store recorded in range is in the log, complete."""
    for st in store.status_rows(
        table.id, Artifact.CHECKPOINT, states=(PublishState.SUCCESS,), from_version=lo, to_version=hi
    ):
        if st.version not in complete:
            names = [n for cp in listing.checkpoints.get(st.version, []) for n in cp.names]
            found = ", ".join(sorted(names)) or "no checkpoint file"
            problems.append(
                Problem(
                    "missing_checkpoint",
                    st.version,
                    f"the store recorded a checkpoint at version {st.version} but the log has {found} there "
                    "(a complete checkpoint is expected)",
                    "a checkpoint file (or one of its parts / sidecars) was deleted after it was written; readers "
                    f"fall back to an older checkpoint. Write it again with `delta-mirror checkpoint {table.name} "
                    f"--version {st.version}`",
                )
            )


def _fetch_hashes(objects: ObjectStore, names: list[str]) -> list[str | None]:
    """SHA-256 of each file, fetched in parallel (object stores answer slowly, not narrowly)."""

    def one(name: str) -> str | None:
        data = objects.get(f"{LOG_DIR}/{name}")
        return None if data is None else _sha(data)

    if len(names) < 4:
        return [one(n) for n in names]
    with ThreadPoolExecutor(max_workers=_FETCH_WORKERS) as pool:
        return list(pool.map(one, names))


def _check_last_checkpoint_pointer(
    store: SqlStore,
    table: TableInfo,
    objects: ObjectStore,
    listing: LogListing,
    last_published: int,
    problems: list[Problem],
) -> None:
    """The ``_last_checkpoint`` pointer (a :class:`LastCheckpoint`) by the one rule
    (:func:`judge_last_checkpoint`); absent is fine."""
    hint = (
        "readers trust _last_checkpoint to find the newest checkpoint; rewrite it with "
        f"`delta-mirror checkpoint {table.name}`"
    )
    for p in judge_last_checkpoint(
        objects.get(LAST_CHECKPOINT_PATH),
        listing,
        sidecar_refs(objects),
        last_published=last_published,
        newest_checkpoint=store.last_checkpoint_version(table.id),
    ):
        problems.append(
            Problem("bad_last_checkpoint", p.version, f"{LAST_CHECKPOINT_PATH} {p.message}", p.cause + hint)
        )


__all__ = ["check_listing"]
