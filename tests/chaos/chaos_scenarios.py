"""The fault-injection scenarios, parametrised by a ``Scale`` (small in ``make test``, large in ``make chaos``).

Each scenario builds its own store and tables, runs real ``delta-mirror`` processes while it injects
faults, stops the faults, runs reconcile cycles until every invariant of docs/architecture.md holds again,
runs ``validate``, and returns a ``ScenarioResult`` with what it injected and what it found.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos_harness import (
    Scheduler,
    Writer,
    add_action,
    cli,
    cli_env,
    create_table,
    kill_after,
    recover,
    spawn,
)
from chaos_results import (
    LARGE,
    SMALL,
    CommitWatch,
    Scale,
    ScenarioResult,
    Services,
    finish,
    judge,
    new_store,
    safe_now,
)

from delta_mirror.store import SqlStore

FAILPOINTS = (
    "publish.after_put",
    "checkpoint.after_part",
    "checkpoint.before_last_checkpoint",
    "checkpoint.after_last_checkpoint",
)


# --------------------------------------------------------------------------------------------------
# 1. S3 behind the fault proxy


def s3_faults(svc: Services, scale: Scale) -> ScenarioResult:
    """500 / 503 SlowDown / timeouts / resets mid-body / slow answers on every log request."""
    bucket = svc.s3.make_bucket("chaos-s3-")
    store_url = f"sqlite:///{svc.workdir / 's3_faults.db'}"
    store = new_store(store_url)
    names = [f"s3f{i}" for i in range(scale.tables)]
    locations = {n: f"s3://{bucket}/{n}" for n in names}
    for i, n in enumerate(names):
        create_table(store, n, locations[n], interval=4, part_size=3 if i % 2 else None)
    env = cli_env(store_url, svc.proxy.endpoint)
    svc.proxy.reset()
    svc.proxy.configure(
        rate=scale.s3_fault_rate,
        kinds={"500": 1, "503": 1, "timeout": 0.4, "reset": 1, "slow": 0.8},
        hold=1.5,
        refuse_writes=None,
    )
    watch = CommitWatch(locations, svc.s3.client())
    watch.start()
    stop = threading.Event()
    writer = Writer(store_url, names, scale.s3_versions, pace=0.01)
    schedulers = [Scheduler(env, [n], stop) for n in names]  # waits on faults, not CPU
    _run_until_published(store, names, writer, schedulers, stop, timeout=600)
    tail = _failing_tail(svc, store, names, env)
    stats = svc.proxy.configure(rate=0)
    result = ScenarioResult("s3_faults", stats["faults_total"], stats["faults"])
    result.notes = {
        "requests": stats["requests"],
        "mirror_exits": _merge(s.exits for s in schedulers),
        "left_for_recovery": tail,
    }
    safe_now(result, store_url, locations, env, svc)
    store.close()
    return finish(result, store_url, locations, env, svc, watch, proxy_stats=stats)


def _failing_tail(svc: Services, store: SqlStore, names: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The faults end on a failing note: new commits, and one run per table while every request fails.

    Recovery then starts from FAILED versions and failure counts in the breakers, not from a clean slate.
    """
    for name in names:
        for i in range(3):
            store.commit(name, [add_action(i)])
    svc.proxy.configure(rate=1.0, kinds={"500": 1, "503": 1, "reset": 1})
    runs = [spawn(env, "mirror", n) for n in names]
    exits = [p.wait() for p in runs]
    for p in runs:
        p.communicate()
    pending = sum(
        (store.latest_version(t.id) or 0) - (store.last_published_version(t.id) or 0)
        for t in map(store.get_table, names)
    )
    return {"failed_runs": sum(1 for rc in exits if rc != 0), "unpublished_versions": pending}


def _run_until_published(
    store: SqlStore,
    names: list[str],
    writer: Writer,
    loops: list[Scheduler],
    stop: threading.Event,
    timeout: float,
) -> None:
    """Start the writer and the loops; once the writer is done and every table published (or
    ``timeout`` passed), stop the loops and wait for them."""
    writer.start()
    for s in loops:
        s.start()
    writer.join()
    _wait_published(store, names, timeout=timeout)
    stop.set()
    for s in loops:
        s.join()


def _wait_published(store: SqlStore, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = True
        for n in names:
            t = store.get_table(n)
            if store.last_published_version(t.id) != store.latest_version(t.id):
                done = False
        if done:
            return
        time.sleep(0.2)


def _merge(dicts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[str(k)] = out.get(str(k), 0) + v
    return out


# --------------------------------------------------------------------------------------------------
# 2. publishers killed with SIGKILL


def kills(svc: Services, scale: Scale, store_url: str | None = None) -> ScenarioResult:
    """SIGKILL at the failpoints (after put / mid-checkpoint / around _last_checkpoint) and at random
    times; on a SQLite file unless ``store_url`` names another (empty) store."""
    rng = random.Random(svc.seed + 2)
    store_url = store_url or f"sqlite:///{svc.workdir / 'kills.db'}"
    store = new_store(store_url)
    names = [f"kill{i}" for i in range(max(2, scale.tables + 1))]
    folder = svc.workdir / f"kills-{store.engine.dialect.name}"  # one per backend run in a workdir
    locations = {n: (folder / n).as_uri() for n in names}
    for i, n in enumerate(names):
        create_table(store, n, locations[n], interval=3, part_size=2 if i % 2 else None)
    env = cli_env(store_url)
    lock = threading.Lock()
    kinds: dict[str, int] = {}
    stop = threading.Event()

    def launch(env: dict[str, str], name: str) -> int:
        with lock:
            r = rng.random()
            point, nth, delay = rng.choice(FAILPOINTS), rng.randint(1, 3), rng.uniform(0.3, 0.9)
        if r < 0.65:
            rc = cli({**env, "DELTA_MIRROR_FAILPOINTS": f"{point}:{nth}"}, "mirror", name).returncode
            kind = point
        else:
            proc = spawn(env, "mirror", name)
            rc = -9 if kill_after(proc, delay) else proc.returncode
            proc.communicate()
            kind = "random_time"
        if rc == -9:
            with lock:
                kinds[kind] = kinds.get(kind, 0) + 1
        return rc

    watch = CommitWatch(locations)
    watch.start()
    writer = Writer(store_url, names, 10**9, pace=1.0)  # runs until the kills are done
    writer.start()
    schedulers = [Scheduler(env, [n], stop, launch) for n in names]
    for s in schedulers:
        s.start()
    deadline = time.monotonic() + 900
    while sum(kinds.values()) < scale.kills and time.monotonic() < deadline:
        time.sleep(0.2)
    writer.versions = 0  # stop committing
    stop.set()
    for s in schedulers:
        s.join()
    writer.join()
    result = ScenarioResult("publisher_sigkill", sum(kinds.values()), dict(kinds))
    result.notes = {"mirror_exits": _merge(s.exits for s in schedulers), "backend": store.engine.dialect.name}
    safe_now(result, store_url, locations, env, svc)
    store.close()
    return finish(result, store_url, locations, env, svc, watch)


# --------------------------------------------------------------------------------------------------
# 3. PostgreSQL restarted while publishing


def pg_restarts(svc: Services, scale: Scale) -> ScenarioResult:
    rng = random.Random(svc.seed + 3)
    store_url = svc.pg.create_database("chaos_")
    store = new_store(store_url)
    names = [f"pg{i}" for i in range(scale.tables)]
    locations = {n: (svc.workdir / "pg" / n).as_uri() for n in names}
    for i, n in enumerate(names):
        create_table(store, n, locations[n], interval=4, part_size=2 if i % 2 else None)
    store.close()
    env = cli_env(store_url)
    watch = CommitWatch(locations)
    watch.start()
    stop = threading.Event()
    writer = Writer(store_url, names, 10**9, pace=0.05)
    writer.start()
    schedulers = [Scheduler(env, names[i::2], stop) for i in range(2)]
    for s in schedulers:
        s.start()
    kinds: dict[str, int] = {}
    for _ in range(scale.pg_restarts):
        time.sleep(rng.uniform(1.5, 3.0))
        mode = rng.choice(["immediate", "fast"])
        svc.pg.restart(mode)
        kinds[mode] = kinds.get(mode, 0) + 1
    time.sleep(1.0)
    writer.versions = 0
    stop.set()
    for s in schedulers:
        s.join()
    writer.join()
    result = ScenarioResult("postgres_restart", sum(kinds.values()), kinds)
    result.notes = {
        "mirror_exits": _merge(s.exits for s in schedulers),
        "writer_retries": writer.errors,
        "mirror_seconds": round(sum(s.busy_seconds for s in schedulers), 1),
    }
    safe_now(result, store_url, locations, env, svc)
    return finish(result, store_url, locations, env, svc, watch)


# --------------------------------------------------------------------------------------------------
# 4. publishers racing on the same tables


def race(svc: Services, scale: Scale, publishers: int, store_url: str | None = None) -> ScenarioResult:
    """N publisher loops + a reconcile loop on the same tables while a writer commits.

    With 4 publishers the store is PostgreSQL and the tables are on S3 behind the proxy with slow
    answers and some faults, so runs outlive their lease and leases change hands mid-run. Otherwise
    the tables are local folders and the store a SQLite file, or ``store_url`` (an empty store).
    """
    big = publishers >= 4 and svc.pg is not None
    store_url = store_url or (
        svc.pg.create_database("chaos_") if big else f"sqlite:///{svc.workdir / f'race{publishers}.db'}"
    )
    store = new_store(store_url)
    names = [f"race{publishers}_{i}" for i in range(2)]
    if big:
        bucket = svc.s3.make_bucket("chaos-race-")
        locations = {n: f"s3://{bucket}/{n}" for n in names}
        env = cli_env(store_url, svc.proxy.endpoint)
        svc.proxy.reset()
        svc.proxy.configure(rate=0.15, kinds={"slow": 3, "500": 1, "503": 1, "reset": 1}, refuse_writes=None)
    else:
        folder = svc.workdir / f"race{publishers}-{store.engine.dialect.name}"  # one per backend run
        locations = {n: (folder / n).as_uri() for n in names}
        env = cli_env(store_url)
    for i, n in enumerate(names):
        create_table(store, n, locations[n], interval=3, part_size=2 if i % 2 else None)
    watch = CommitWatch(locations, svc.s3.client())
    watch.start()
    stop = threading.Event()
    writer = Writer(store_url, names, scale.race_versions, pace=0.1)
    loops = [Scheduler(env, names if i % 2 else names[::-1], stop) for i in range(publishers)]
    loops.append(
        Scheduler(env, names, stop, lambda e, _n: cli(e, "reconcile", "--strategy", "smart").returncode)
    )
    _run_until_published(store, names, writer, loops, stop, timeout=300)
    tail = _failing_tail(svc, store, names, env) if big else None
    stats = svc.proxy.configure(rate=0) if big else None
    faults = stats["faults_total"] if stats else 0
    result = ScenarioResult(f"race_{publishers}_publishers", faults, stats["faults"] if stats else {})
    result.notes = {
        "publisher_exits": _merge(s.exits for s in loops[:-1]),
        "backend": "postgresql + s3 (proxy)" if big else f"{store.engine.dialect.name} + local",
        "left_for_recovery": tail,
    }
    safe_now(result, store_url, locations, env, svc)
    store.close()
    return finish(result, store_url, locations, env, svc, watch, proxy_stats=stats)


# --------------------------------------------------------------------------------------------------
# 5. an external writer puts its own commit in the log


def external_writer(svc: Services, scale: Scale) -> ScenarioResult:
    """A different ``<v>.json`` appears before the mirror publishes v: detected, halted, never overwritten.

    The operator's documented fix (restore the log: remove the foreign file, then ``resume``) follows,
    and the table must be healthy again within the recovery cycles.
    """
    rng = random.Random(svc.seed + 5)
    bucket = svc.s3.make_bucket("chaos-ext-")
    store_url = f"sqlite:///{svc.workdir / 'external.db'}"
    store = new_store(store_url)
    names = ["ext_local0", "ext_local1", "ext_s3"]
    locations = {
        "ext_local0": (svc.workdir / "ext" / "l0").as_uri(),
        "ext_local1": (svc.workdir / "ext" / "l1").as_uri(),
        "ext_s3": f"s3://{bucket}/ext",
    }
    for n in names:
        create_table(store, n, locations[n], interval=3, part_size=None)
    env = cli_env(store_url, svc.proxy.endpoint)
    svc.proxy.configure(rate=0, refuse_writes=None)
    watch = CommitWatch(locations, svc.s3.client())
    watch.start()
    result = ScenarioResult("external_writer", 0, {})
    detected = 0
    worst = (0, 0.0)
    skip: set[tuple[str, str]] = set()
    for _round in range(scale.foreign_rounds):
        for n in names:
            for i in range(rng.randint(1, 3)):
                store.commit(n, [add_action(i)])
        assert all(cli(env, "mirror", n).returncode == 0 for n in names)
        foreign: dict[str, dict[str, bytes]] = {}
        for n in names:
            t = store.get_table(n)
            nxt = (store.latest_version(t.id) or 0) + 1
            fname = f"{nxt:020d}.json"
            data = (
                json.dumps(
                    {"commitInfo": {"operation": "WRITE", "engineInfo": f"outsider-{uuid.uuid4()}"}}
                ).encode()
                + b"\n"
            )
            when = rng.choice(["before_commit", "after_commit"])
            if when == "after_commit":
                store.commit(n, [add_action(nxt)])
            _put_direct(svc, locations[n], fname, data)
            if when == "before_commit":
                store.commit(n, [add_action(nxt)])
            foreign[n] = {fname: data}
            result.fault_kinds[when] = result.fault_kinds.get(when, 0) + 1
        # Detection: the mirror (exit 3) for some tables, a smart reconcile for the others.
        by_mirror = [n for n in names if rng.random() < 0.5]
        codes = {n: cli(env, "mirror", n).returncode for n in by_mirror}
        cli(env, "reconcile", "--strategy", "smart")
        safe_now(result, store_url, locations, env, svc, foreign)
        for n in names:
            t = store.get_table(n)
            ((fname, data),) = foreign[n].items()
            untouched = _get_direct(svc, locations[n], fname) == data
            if t.state == "HALTED" and untouched and codes.get(n, 3) == 3:
                detected += 1
            else:
                result.violations.append(
                    f"{n}: foreign {fname} not detected (state {t.state}, exit {codes.get(n)})"
                )
            skip.add((n, fname))
        # The operator restores the log and resumes the table.
        for n in names:
            ((fname, _),) = foreign[n].items()
            _delete_direct(svc, locations[n], fname)
            assert cli(env, "resume", n).returncode == 0
        rec = recover(store_url, locations, env, svc.s3.client())
        worst = max(worst, (rec.cycles, rec.seconds))
        if not rec.recovered:
            judge(ScenarioResult("x", 0, {}), rec.verdicts)
            result.violations.append(f"round {_round}: not recovered within {rec.cycles - 1} cycles")
        result.faults += len(names)
    result.notes = {"detected_and_halted": detected}
    store.close()
    final = finish(result, store_url, locations, env, svc, watch, skip=skip)
    final.recover_cycles = max(worst[0], final.recover_cycles)
    final.recover_seconds = max(worst[1], final.recover_seconds)
    return final


def _split(location: str) -> tuple[str, str]:
    rest = location.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    return bucket, f"{prefix}/_delta_log/"


def _put_direct(svc: Services, location: str, fname: str, data: bytes) -> None:
    if location.startswith("file://"):
        path = Path(location.removeprefix("file://")) / "_delta_log" / fname
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    else:
        bucket, prefix = _split(location)
        svc.s3.client().put_object(Bucket=bucket, Key=prefix + fname, Body=data)


def _get_direct(svc: Services, location: str, fname: str) -> bytes | None:
    if location.startswith("file://"):
        path = Path(location.removeprefix("file://")) / "_delta_log" / fname
        return path.read_bytes() if path.exists() else None
    bucket, prefix = _split(location)
    try:
        return bytes(svc.s3.client().get_object(Bucket=bucket, Key=prefix + fname)["Body"].read())
    except svc.s3.client().exceptions.NoSuchKey:
        return None


def _delete_direct(svc: Services, location: str, fname: str) -> None:
    if location.startswith("file://"):
        (Path(location.removeprefix("file://")) / "_delta_log" / fname).unlink(missing_ok=True)
    else:
        bucket, prefix = _split(location)
        svc.s3.client().delete_object(Bucket=bucket, Key=prefix + fname)


# --------------------------------------------------------------------------------------------------
# 6. a read-only or full target


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return proc.returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def target_faults(svc: Services, scale: Scale) -> ScenarioResult:
    """Local: a tmpfs filled up, or remounted read-only. S3: the proxy refuses writes (403, 507)."""
    bucket = svc.s3.make_bucket("chaos-tgt-")
    store_url = f"sqlite:///{svc.workdir / 'target.db'}"
    store = new_store(store_url)
    mnt = svc.workdir / "tmpfs"
    local = _mount_tmpfs(mnt, "2m")
    names = ["tgt_s3"] + (["tgt_local"] if local else [])
    locations = {"tgt_s3": f"s3://{bucket}/tgt"}
    if local:
        locations["tgt_local"] = (mnt / "tgt").as_uri()
    for n in names:
        create_table(store, n, locations[n], interval=3, part_size=None)
    env = cli_env(store_url, svc.proxy.endpoint)
    svc.proxy.configure(rate=0, refuse_writes=None)
    for n in names:
        assert cli(env, "mirror", n).returncode == 0
    watch = CommitWatch(locations, svc.s3.client())
    watch.start()
    result = ScenarioResult("readonly_or_full_target", 0, {})
    result.notes["local_target"] = "tmpfs (mount -t tmpfs)" if local else "unavailable: mount failed"
    worst = (0, 0.0)
    refused = 0
    try:
        for _round in range(scale.target_rounds):
            for kind in ["s3_403_read_only", "s3_507_full"] + (
                ["local_full", "local_read_only"] if local else []
            ):
                n = "tgt_s3" if kind.startswith("s3") else "tgt_local"
                for i in range(2):
                    store.commit(n, [add_action(i)])
                _start_target_fault(svc, mnt, kind)
                rc = cli(env, "mirror", n).returncode
                if rc != 0:
                    refused += 1
                else:
                    result.violations.append(f"{kind}: the mirror reported success on a refusing target")
                safe_now(result, store_url, locations, env, svc)
                _end_target_fault(svc, mnt, kind)
                result.fault_kinds[kind] = result.fault_kinds.get(kind, 0) + 1
                result.faults += 1
                rec = recover(store_url, locations, env, svc.s3.client())
                worst = max(worst, (rec.cycles, rec.seconds))
                if not rec.recovered:
                    result.violations.append(f"{kind}: not recovered within {rec.cycles - 1} cycles")
                    for name, v in rec.verdicts.items():
                        result.violations += [f"{name}: {u}" for u in v.unfinished[:3]]
        result.notes["runs_refused"] = refused
        store.close()
        final = finish(result, store_url, locations, env, svc, watch)
    finally:
        if local:
            _umount(mnt)
    final.recover_cycles = max(worst[0], final.recover_cycles)
    final.recover_seconds = max(worst[1], final.recover_seconds)
    return final


def _start_target_fault(svc: Services, mnt: Path, kind: str) -> None:
    """The target starts refusing writes: the bucket read-only (403) or full (507), the tmpfs full or
    remounted read-only."""
    if kind == "s3_403_read_only":
        svc.proxy.configure(refuse_writes="403")
    elif kind == "s3_507_full":
        svc.proxy.configure(refuse_writes="507")
    elif kind == "local_full":
        _fill(mnt / "filler")
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)


def _end_target_fault(svc: Services, mnt: Path, kind: str) -> None:
    """The fault ends: space freed, mount writable again, bucket policy fixed."""
    svc.proxy.configure(refuse_writes=None)
    if kind == "local_full":
        (mnt / "filler").unlink()
    elif kind == "local_read_only":
        subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)


def _fill(path: Path) -> None:
    try:
        with open(path, "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    except OSError:
        pass


# --------------------------------------------------------------------------------------------------


def run_all(svc: Services, scale: Scale, only: list[str] | None = None) -> list[ScenarioResult]:
    scenarios: dict[str, Callable[[], ScenarioResult]] = {
        "s3_faults": lambda: s3_faults(svc, scale),
        "publisher_sigkill": lambda: kills(svc, scale),
        "postgres_restart": lambda: pg_restarts(svc, scale),
        "race_2": lambda: race(svc, scale, 2),
        "race_4": lambda: race(svc, scale, 4),
        "external_writer": lambda: external_writer(svc, scale),
        "readonly_or_full_target": lambda: target_faults(svc, scale),
    }
    results = []
    for name, fn in scenarios.items():
        if only and name not in only:
            continue
        started = time.monotonic()
        result = fn()
        result.notes["seconds"] = round(time.monotonic() - started, 1)
        results.append(result)
    return results


def summary(results: list[ScenarioResult], scale: Scale, seconds: float) -> dict[str, Any]:
    worst = max(results, key=lambda r: (r.recover_cycles, r.recover_seconds))
    return {
        "scale": scale.name,
        "scenarios": len(results),
        "faults_injected": sum(r.faults for r in results),
        "versions_committed": sum(r.committed for r in results),
        "versions_published": sum(r.published for r in results),
        "lost": sum(r.lost for r in results),
        "duplicated": sum(r.duplicated for r in results),
        "corrupted": sum(r.corrupted for r in results),
        "overwritten": sum(r.overwritten for r in results),
        "invariant_violations": sum(len(r.violations) for r in results),
        "max_recover_seconds": max(r.recover_seconds for r in results),
        "max_recover_cycles": worst.recover_cycles,
        "all_recovered_within_2_cycles": all(r.recover_cycles <= 2 for r in results),
        "runtime_seconds": round(seconds, 1),
        "per_scenario": {
            r.name: {
                "faults": r.faults,
                "fault_kinds": r.fault_kinds,
                "committed": r.committed,
                "published": r.published,
                "recover_cycles": r.recover_cycles,
                "recover_seconds": r.recover_seconds,
                "violations": r.violations[:10],
                **r.notes,
            }
            for r in results
        },
    }


__all__ = ["LARGE", "SMALL", "Scale", "ScenarioResult", "Services", "run_all", "summary"]
