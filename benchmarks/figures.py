"""The benchmark's parent side: runs pieces in children, and the figures that compare our side
with the peer (``Bench``), plus what the machine was.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pieces import CHILD_TIMEOUT, REPO, RESULT_MARK, RESULTS_DIR, SIZES, SOURCE_300K, log, vacuum_analyze

# ================================================================================================
# Parent: orchestration
# ================================================================================================

_current_child: subprocess.Popen[str] | None = None


def current_child() -> subprocess.Popen[str] | None:
    """The piece running now, if any (killed when the parent is interrupted)."""
    return _current_child


def child(piece_name: str, /, **args: Any) -> dict[str, Any]:
    """Run one piece in a fresh interpreter; return its measurements."""
    global _current_child
    cmd = [
        sys.executable,
        str(Path(__file__).resolve().parent / "run.py"),
        "--child",
        piece_name,
        json.dumps(args),
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
    _current_child = proc
    try:
        stdout, _ = proc.communicate(timeout=CHILD_TIMEOUT)
    finally:
        _current_child = None
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"piece {piece_name} failed (exit {proc.returncode}); see stderr above")
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if not lines:
        raise RuntimeError(f"piece {piece_name} printed no result")
    result: dict[str, Any] = json.loads(lines[-1][len(RESULT_MARK) :])
    result["process_seconds"] = round(time.perf_counter() - t0, 3)
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median wall and median peak RSS over repeats, with every run kept."""
    out = {
        "seconds": round(statistics.median(r["seconds"] for r in runs), 4),
        "peak_rss_mib": round(statistics.median(r["peak_rss_mib"] for r in runs), 1),
        "rss_before_mib": round(statistics.median(r["rss_before_mib"] for r in runs), 1),
    }
    if len(runs) > 1:
        out["runs"] = [{"seconds": r["seconds"], "peak_rss_mib": r["peak_rss_mib"]} for r in runs]
    return out


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def remove_checkpoint(folder: Path, version: int) -> None:
    log_dir = folder / "_delta_log"
    for p in log_dir.glob(f"{version:020d}.checkpoint*.parquet"):
        p.unlink()
    with contextlib.suppress(FileNotFoundError):
        (log_dir / "_last_checkpoint").unlink()


class Bench:
    def __init__(self, opts: argparse.Namespace, server: Any, tmp: Path, corpus: Path) -> None:
        self.opts = opts
        self.server = server
        self.tmp = tmp
        self.corpus = corpus
        self.idx = 1 if opts.quick else 0
        default_repeat = SIZES["repeat"][self.idx]
        assert default_repeat is not None
        self.repeat: int = opts.repeat or default_repeat
        self.databases: list[str] = []
        self.profiles: dict[str, Any] = {}

    def size(self, key: str) -> Any:
        return SIZES[key][self.idx]

    def new_db(self) -> str:
        url: str = self.server.create_database("dm_bench_")
        self.databases.append(url)
        return url

    def profile(
        self, label: str, piece_name: str, before: Callable[[], None] | None = None, **args: Any
    ) -> None:
        """Re-run one of our pieces under cProfile + the RSS sampler (not used for the figures)."""
        if not self.opts.profile:
            return
        if before:
            before()
        path = RESULTS_DIR / f"profile-{label}.txt"
        log(f"profiling {label} -> {path}")
        res = child(piece_name, **args, profile=str(path))
        self.profiles[label] = {
            "profile_file": str(path.relative_to(REPO)),
            "seconds_under_profiler": res["seconds"],
            "peak_rss_mib": res["peak_rss_mib"],
            "pyarrow_max_memory_mib": res.get("pyarrow_max_memory_mib"),
            "memory": res.get("memory_profile"),
        }

    # -- figure 1 ---------------------------------------------------------------------------------
    def fig_publish(self) -> dict[str, Any]:
        versions = self.size("publish_versions") + 1  # + version 0 (protocol + metaData)
        adds = self.size("publish_adds")
        url = self.new_db()
        root = self.tmp / "publish"
        reps = range(self.repeat)
        # "default": the table's own checkpoint policy (delta.checkpointInterval=100, as deltalake's);
        # "json": automatic checkpoints off, so only the JSON commits are published (what bare does).
        tables = [
            {
                "name": f"{kind}-{r}",
                "location": str(root / f"{kind}-{r}"),
                "auto_checkpoint": kind == "default",
            }
            for r in reps
            for kind in ("default", "json")
        ]
        if self.opts.profile:
            tables.append({"name": "profile", "location": str(root / "profile"), "auto_checkpoint": True})
        log(
            f"publish: committing {versions} versions x {adds} adds into {len(tables)} tables (setup, not timed)"
        )
        setup = child("publish_setup", url=url, tables=tables, versions=versions, adds=adds)
        vacuum_analyze(url)
        default_runs, json_runs, bare_runs = [], [], []
        for r in reps:
            default_runs.append(child("publish_ours", url=url, name=f"default-{r}"))
            json_runs.append(child("publish_ours", url=url, name=f"json-{r}"))
            bare_runs.append(
                child("publish_bare", source=str(root / f"json-{r}"), location=str(root / f"bare-{r}"))
            )
            log(
                f"publish run {r + 1}/{self.repeat}: ours {default_runs[-1]['seconds']:.3f}s, "
                f"ours json-only {json_runs[-1]['seconds']:.3f}s, bare {bare_runs[-1]['seconds']:.3f}s"
            )
        log(f"publish: deltalake, {versions} versions (one run: it takes minutes)")
        dl = child("publish_deltalake", location=str(root / "deltalake"), versions=versions, adds=adds)
        log(f"publish: deltalake {dl['seconds']:.2f}s")
        self.profile("publish", "publish_ours", url=url, name="profile")

        def fig(runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
            out = summarize(runs)
            return {"versions": n, "versions_per_s": round(n / out["seconds"], 1), **out}

        n = versions
        o, j, b, d = fig(default_runs, n), fig(json_runs, n), fig(bare_runs, n), fig([dl], dl["version"] + 1)
        o["checkpoints_written"] = default_runs[0]["checkpoints"]
        j["checkpoints_written"] = json_runs[0]["checkpoints"]
        return {
            "versions": versions,
            "adds_per_version": adds,
            "setup_seconds_per_table": setup["seconds_per_table"],
            "setup_commits_per_s": round(versions / statistics.median(setup["seconds_per_table"]), 1),
            "ours": o,
            "ours_json_only": j,
            "bare": b,
            "deltalake": d,
            "notes": "ours = Publisher.publish with the table's checkpoint policy (interval 100, checked per "
            "500-version batch); ours_json_only = same with automatic checkpoints off (the bytes bare writes); "
            "bare = put_if_absent + head per file, no database; deltalake = DeltaTable.create + one "
            "create_write_transaction per version + update_incremental(), post-commit hooks at defaults "
            "(checkpoint every 100 versions), one run",
            "bare_bytes": bare_runs[0]["bytes"],
            "ratio_vs_bare": ratio(o["versions_per_s"], b["versions_per_s"]),
            "json_only_ratio_vs_bare": ratio(j["versions_per_s"], b["versions_per_s"]),
            "speedup_vs_deltalake": ratio(o["versions_per_s"], d["versions_per_s"]),
            "targets": {
                "json_only_ge_0.5x_bare": j["versions_per_s"] >= 0.5 * b["versions_per_s"],
                "with_checkpoints_ge_0.5x_bare": o["versions_per_s"] >= 0.5 * b["versions_per_s"],
                "faster_than_deltalake": o["versions_per_s"] > d["versions_per_s"],
            },
        }

    # -- figure 2 ---------------------------------------------------------------------------------
    def source_300k(self) -> tuple[Path, bool]:
        src = self.corpus / SOURCE_300K
        if not (src / "_delta_log").is_dir():
            raise FileNotFoundError(f"corpus table missing: {src}")
        keep = self.size("truncated_300k_adds")
        if keep is None:
            return src, False
        # --quick: a copy with the same shape (every commit keeps its share of the adds).
        dst = self.tmp / "src-300k-truncated"
        (dst / "_delta_log").mkdir(parents=True)
        files = sorted((src / "_delta_log").glob("*.json"))
        total = sum(sum(1 for ln in f.open() if ln.startswith('{"add"')) for f in files)
        for f in files:
            n_adds = sum(1 for ln in f.open() if ln.startswith('{"add"'))
            left = round(n_adds * keep / total)
            with f.open() as fin, (dst / "_delta_log" / f.name).open("w") as fout:
                for line in fin:
                    is_add = line.startswith('{"add"')
                    if not is_add or left > 0:
                        fout.write(line)
                        left -= is_add
        return dst, True

    def fig_300k(self) -> tuple[dict[str, Any], dict[str, Any]]:
        src, truncated = self.source_300k()
        url = self.new_db()
        root = self.tmp / "cp300k"
        pub = root / "published"
        log(f"import: {src} -> PostgreSQL (timed)")
        imp = child("import", url=url, name="t300k", source=str(src), location=str(pub))
        log(f"import: {imp['seconds']:.2f}s, {imp['peak_rss_mib']:.0f} MiB; publishing JSON (not timed)")
        child("disable_auto_checkpoint", url=url, name="t300k")
        pub_res = child("publish_ours", url=url, name="t300k")
        vacuum_analyze(url)
        version = imp["end_version"]
        import_fig = {
            "source": str(src),
            "truncated_for_quick": truncated,
            "commits": imp["commits"],
            "active_files": imp["active_files"],
            "seconds": imp["seconds"],
            "peak_rss_mib": imp["peak_rss_mib"],
            "rss_before_mib": imp["rss_before_mib"],
            "files_per_s": round(imp["active_files"] / imp["seconds"], 1),
            "publish_json_seconds_not_in_checkpoint_figure": pub_res["seconds"],
        }
        ours_runs, dl_runs = [], []
        for r in range(self.repeat):
            remove_checkpoint(pub, version)
            log(f"checkpoint 300k: ours run {r + 1}/{self.repeat}")
            ours_runs.append(child("checkpoint_ours", url=url, name="t300k"))
            copy = root / f"dl-copy-{r}"
            shutil.copytree(src, copy)
            log(f"checkpoint 300k: deltalake run {r + 1}/{self.repeat}")
            dl_runs.append(child("checkpoint_deltalake", location=str(copy)))
            shutil.rmtree(copy, ignore_errors=True)
        verify = child("verify_deltalake", location=str(pub))
        self.profile(
            "checkpoint_300k",
            "checkpoint_ours",
            lambda: remove_checkpoint(pub, version),
            url=url,
            name="t300k",
        )
        o, d = summarize(ours_runs), summarize(dl_runs)
        cp_file = pub / "_delta_log" / f"{version:020d}.checkpoint.parquet"
        fig = {
            "version": version,
            "active_files": imp["active_files"],
            "ours": o,
            "deltalake": d,
            "ours_checkpoint_bytes": cp_file.stat().st_size if cp_file.exists() else None,
            "verified_by_deltalake": {
                "active_files": verify["active_files"],
                "matches": verify["active_files"] == imp["active_files"] and verify["version"] == version,
            },
            "time_ratio_vs_deltalake": ratio(o["seconds"], d["seconds"]),
            "rss_ratio_vs_deltalake": ratio(o["peak_rss_mib"], d["peak_rss_mib"]),
            "targets": {
                "time_le_1.0x_deltalake": o["seconds"] <= d["seconds"],
                "rss_le_1.0x_deltalake": o["peak_rss_mib"] <= d["peak_rss_mib"],
            },
        }
        return import_fig, fig

    # -- figure 3 ---------------------------------------------------------------------------------
    def fig_history(self) -> dict[str, Any]:
        commits = self.size("history_commits")
        adds, removes = self.size("history_adds"), self.size("history_removes")
        url = self.new_db()
        root = self.tmp / "history"
        pub = root / "published"
        log(
            f"history: generating {commits} commits ({adds} adds + {removes} removes) through SqlStore.commit"
        )
        setup = child(
            "history_setup",
            url=url,
            name="hist",
            location=str(pub),
            commits=commits,
            adds=adds,
            removes=removes,
        )
        log(f"history: setup {setup['seconds']:.1f}s; publishing (not timed)")
        child("disable_auto_checkpoint", url=url, name="hist")
        pub_res = child("publish_ours", url=url, name="hist")
        vacuum_analyze(url)
        version = setup["latest_version"]
        pristine = root / "published-pristine"  # a copy without any checkpoint, for deltalake
        shutil.copytree(pub, pristine)
        ours_runs, dl_runs = [], []
        for r in range(self.repeat):
            remove_checkpoint(pub, version)
            log(f"history: ours checkpoint run {r + 1}/{self.repeat}")
            ours_runs.append(child("checkpoint_ours", url=url, name="hist"))
            copy = root / f"dl-copy-{r}"
            shutil.copytree(pristine, copy)
            log(f"history: deltalake checkpoint run {r + 1}/{self.repeat}")
            dl_runs.append(child("checkpoint_deltalake", location=str(copy)))
            shutil.rmtree(copy, ignore_errors=True)
        verify = child("verify_deltalake", location=str(pub))
        self.profile(
            "checkpoint_history",
            "checkpoint_ours",
            lambda: remove_checkpoint(pub, version),
            url=url,
            name="hist",
        )
        o, d = summarize(ours_runs), summarize(dl_runs)
        speedup = ratio(d["seconds"], o["seconds"])
        return {
            "commits": commits,
            "adds_per_commit": adds,
            "removes_per_commit": removes,
            "version": version,
            "active_files": setup["active_files"],
            "setup_seconds": setup["seconds"],
            "setup_commits_per_s": round(commits / setup["seconds"], 1),
            "setup_over_3_min": setup["seconds"] > 180,
            "publish_json_seconds_not_in_checkpoint_figure": pub_res["seconds"],
            "ours": o,
            "deltalake": d,
            "verified_by_deltalake": {
                "active_files": verify["active_files"],
                "matches": verify["active_files"] == setup["active_files"] and verify["version"] == version,
            },
            "speedup_vs_deltalake": speedup,
            "rss_ratio_vs_deltalake": ratio(o["peak_rss_mib"], d["peak_rss_mib"]),
            "targets": {"ge_2x_faster_than_deltalake": speedup is not None and speedup >= 2.0},
        }


# ================================================================================================
# Machine info and main
# ================================================================================================


def machine_info(pg_url: str) -> dict[str, Any]:
    from importlib import metadata

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    meminfo = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            meminfo[k] = int(v.split()[0])
    cpu = None
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    pg_version = None
    with contextlib.suppress(Exception):
        import sqlalchemy as sa

        engine = sa.create_engine(pg_url)
        with engine.connect() as conn:
            pg_version = str(conn.execute(sa.text("select version()")).scalar_one())
        engine.dispose()
    git = None
    with contextlib.suppress(Exception):
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
        git = head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    digest = hashlib.sha256()
    for source in sorted((REPO / "include" / "delta_mirror").rglob("*.py")):
        digest.update(str(source.relative_to(REPO)).encode() + b"\0" + source.read_bytes())
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "nproc": os.cpu_count(),
        "nproc_available": len(os.sched_getaffinity(0)),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "cpu": cpu,
        "memory_total_mib": round(meminfo.get("MemTotal", 0) / 1024),
        "memory_available_mib": round(meminfo.get("MemAvailable", 0) / 1024),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            p: version(p)
            for p in ("delta-mirror", "deltalake", "pyarrow", "sqlalchemy", "psycopg", "obstore")
        },
        "postgresql": pg_version,
        "postgresql_settings": "throwaway server from tests/support/services.py (fsync=off, full_page_writes=off)",
        "git": git,
        "delta_mirror_source_sha256": digest.hexdigest()[:16],
    }
