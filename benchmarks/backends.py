"""The publish, import and checkpoint figures on every store backend, side by side (issue 30).

The same pieces as figures 1 and 2 (``pieces.py``: each in a fresh child process), at one size for
all four stores so their numbers compare: SQLite and DuckDB files in the run's temporary folder, a
fresh database on the benchmark's PostgreSQL server and on a throwaway MariaDB server started here
(``tests/support/mariadb.py``; ``DELTA_MIRROR_TEST_MYSQL`` for an external one). The backends run one
after the other, never at once (a DuckDB file takes one process at a time, and the figures would
share the two cores), in the same run and on the same machine.

- ``publish``: ``VERSIONS`` versions x 10 adds bulk-inserted (not timed), then a whole
  ``delta-mirror mirror`` process timed by the parent (interpreter start and imports included, as in
  figure 1); median over ``repeat`` tables; ``versions_per_s``.
- ``import``: the corpus's 300k-file table, cut to ``IMPORT_ADDS`` adds (every commit keeps its share,
  as ``--quick`` does for figure 2), imported by ``import_table`` (timed in the child); ``files_per_s``.
- ``checkpoint``: that table's commits published (not timed), then ``Publisher.checkpoint`` at its
  latest version (timed in the child), median over ``repeat``; the result opened by deltalake
  (``verified_by_deltalake``: its version and active-file count are the store's).

Only PostgreSQL gets a ``VACUUM ANALYZE`` after its setups (figure 1's rule); the other stores are
measured as they are after the inserts. A backend that fails is reported under ``errors`` and the
others still run.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from figures import Bench, child, remove_checkpoint
from pieces import SOURCE_300K, log, vacuum_analyze

BACKENDS = ("sqlite", "postgresql", "mysql", "duckdb")
#: (full run, --quick)
VERSIONS = (2000, 200)
ADDS_PER_VERSION = 10
IMPORT_ADDS = (100_000, 10_000)


def figure(bench: Bench, only: tuple[str, ...] = BACKENDS) -> dict[str, Any]:
    """Every backend's publish / import / checkpoint figures; ``errors`` names a backend that failed."""
    versions = VERSIONS[bench.idx] + 1  # + version 0 (protocol + metaData)
    source, adds = _cut_300k(bench, IMPORT_ADDS[bench.idx])
    out: dict[str, Any] = {
        "load": {
            "publish": f"{versions} versions x {ADDS_PER_VERSION} adds, one `delta-mirror mirror` process",
            "import": f"{SOURCE_300K} cut to {adds} adds ({_commits(source)} commits)",
            "checkpoint": f"the imported table's latest version ({adds} active files)",
            "repeat": bench.repeat,
        },
        "errors": {},
    }
    with _mariadb() as mariadb:
        for backend in only:
            try:
                url = _store_url(bench, backend, mariadb)
                out[backend] = _measure(bench, backend, url, versions, source)
            except Exception as exc:  # one backend failing leaves the others' figures
                log(f"backends: {backend} failed: {exc}")
                out["errors"][backend] = f"{type(exc).__name__}: {str(exc)[:500]}"
    out["side_by_side"] = _side_by_side(out, only)
    return out


def _measure(bench: Bench, backend: str, url: str, versions: int, source: Path) -> dict[str, Any]:
    root = bench.tmp / f"backends-{backend}"
    return {
        "store": url.split(":", 1)[0],
        "publish": _publish(bench, backend, url, versions, root / "publish"),
        **_import_and_checkpoint(bench, backend, url, source, root / "t300k"),
    }


def _publish(bench: Bench, backend: str, url: str, versions: int, root: Path) -> dict[str, Any]:
    tables = [
        {"name": f"json-{r}", "location": str(root / f"json-{r}"), "auto_checkpoint": False}
        for r in range(bench.repeat)
    ]
    log(f"backends ({backend}): publish setup, {len(tables)} x {versions} versions (not timed)")
    setup = child("publish_setup_bulk", url=url, tables=tables, versions=versions, adds=ADDS_PER_VERSION)
    if backend == "postgresql":
        vacuum_analyze(url)
    runs = []
    for t in tables:
        runs.append(bench._whole(["-m", "delta_mirror.cli", "mirror", t["name"], "--store", url, "--json"]))
        log(f"backends ({backend}): publish {t['name']}: {runs[-1]['seconds']:.2f}s")
    seconds = statistics.median(r["seconds"] for r in runs)
    return {
        "setup_seconds_per_table": setup["seconds_per_table"],
        "seconds": round(seconds, 3),
        "versions_per_s": round(versions / seconds, 1),
        "cpu_us_per_version": round(statistics.median(r["cpu_seconds"] for r in runs) / versions * 1e6, 1),
        "runs": runs,
    }


def _import_and_checkpoint(bench: Bench, backend: str, url: str, source: Path, pub: Path) -> dict[str, Any]:
    log(f"backends ({backend}): import {source.name} (timed)")
    imp = child("import", url=url, name="t300k", source=str(source), location=str(pub))
    child("disable_auto_checkpoint", url=url, name="t300k")
    child("publish_ours", url=url, name="t300k")
    if backend == "postgresql":
        vacuum_analyze(url)
    version = imp["end_version"]
    runs = []
    for r in range(bench.repeat):
        remove_checkpoint(pub, version)
        log(f"backends ({backend}): checkpoint run {r + 1}/{bench.repeat}")
        runs.append(child("checkpoint_ours", url=url, name="t300k"))
    verify = child("verify_deltalake", location=str(pub))
    checkpoint_seconds = statistics.median(r["seconds"] for r in runs)
    return {
        "import": {
            "commits": imp["commits"],
            "active_files": imp["active_files"],
            "seconds": imp["seconds"],
            "files_per_s": round(imp["active_files"] / imp["seconds"], 1),
            "peak_rss_mib": imp["peak_rss_mib"],
        },
        "checkpoint": {
            "version": version,
            "active_files": imp["active_files"],
            "seconds": round(checkpoint_seconds, 4),
            "files_per_s": round(imp["active_files"] / checkpoint_seconds, 1),
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs),
            "runs": [r["seconds"] for r in runs],
            "verified_by_deltalake": verify["version"] == version
            and verify["active_files"] == imp["active_files"],
        },
    }


def _side_by_side(out: dict[str, Any], only: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """One line per backend: the three rates (``None`` where it failed), for docs/configuration.md's table."""
    rows: dict[str, dict[str, Any]] = {}
    for backend in only:
        fig = out.get(backend)
        rows[backend] = {
            "publish_versions_per_s": fig["publish"]["versions_per_s"] if fig else None,
            "import_files_per_s": fig["import"]["files_per_s"] if fig else None,
            "checkpoint_seconds": fig["checkpoint"]["seconds"] if fig else None,
            "checkpoint_verified": fig["checkpoint"]["verified_by_deltalake"] if fig else None,
        }
    return rows


def _store_url(bench: Bench, backend: str, mariadb: Callable[[], Any]) -> str:
    if backend == "sqlite":
        return f"sqlite:///{bench.tmp / 'backends-store.db'}"
    if backend == "duckdb":
        return f"duckdb:///{bench.tmp / 'backends-store.duckdb'}"
    if backend == "postgresql":
        return str(bench.new_db())
    url: str = mariadb().create_database("dm_bench_")
    return url


@contextlib.contextmanager
def _mariadb() -> Iterator[Callable[[], Any]]:
    """A getter for the MariaDB server, started on first use and stopped at the end."""
    started: list[Any] = []

    def get() -> Any:
        if not started:
            from support.mariadb import MariaDbServer  # the tests' throwaway server

            log("backends: starting MariaDB")
            started.append(MariaDbServer.from_env_or_start())
        return started[0]

    try:
        yield get
    finally:
        for server in started:
            log("backends: stopping MariaDB")
            server.stop_and_remove()


def _commits(source: Path) -> int:
    return len(list((source / "_delta_log").glob("*.json")))


def _cut_300k(bench: Bench, keep: int) -> tuple[Path, int]:
    """A copy of the 300k-file table's log keeping ``keep`` adds, each commit its share (the data
    files are not needed: nothing here reads rows). Returns the copy and its add count."""
    src = bench.corpus / SOURCE_300K
    if not (src / "_delta_log").is_dir():
        raise FileNotFoundError(f"corpus table missing: {src}")
    dst = bench.tmp / f"backends-src-{keep}"
    shutil.rmtree(dst, ignore_errors=True)
    (dst / "_delta_log").mkdir(parents=True)
    files = sorted((src / "_delta_log").glob("*.json"))
    per_file = {f: sum(1 for ln in f.open() if ln.startswith('{"add"')) for f in files}
    total = sum(per_file.values()) or 1
    kept = 0
    for f in files:
        left = max(1, round(per_file[f] * keep / total)) if per_file[f] else 0  # no commit left empty
        with f.open() as fin, (dst / "_delta_log" / f.name).open("w") as fout:
            for line in fin:
                is_add = line.startswith('{"add"')
                if not is_add or left > 0:
                    fout.write(line)
                    left -= is_add
                    kept += is_add
    return dst, kept
