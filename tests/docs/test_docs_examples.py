"""The getting-started pages' command blocks, run as a reader would run them (issue 37, item 9).

- docs/getting-started.md, blocks marked ``local``: the CLI on the embedded SQLite store, in an
  empty folder, with only ``.venv/bin`` and the system on the ``PATH``.
- docs/spark-s3.md, blocks marked ``spark-s3``: ``job.py`` and the shell block — the commit
  service, ``spark-submit`` with the page's packages and ``fs.s3a.*`` settings against a real MinIO,
  then ``mirror`` and ``validate``. The test substitutes the MinIO's endpoint and keys (the
  environment the page's first block exports), a fresh bucket for ``delta-lake`` and a free port
  for ``8787``; nothing else. Spark's Ivy cache is the project's (``SPARK_CONF_DIR``).

The cluster page's commands are held to what ``tests/cluster/test_cluster.py`` runs there.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from docs_kit import DOCS, blocks, marked
from support.services import free_port, skip_or_fail
from support.waiting import load_scaled

VENV_BIN = Path(sys.executable).parent


def _script(page: Path, name: str) -> str:
    shell = [b.text for b in marked(page, name) if b.info.split()[0] in ("bash", "sh")]
    assert shell, f"{page.name} has no shell block marked docs-test: {name}"
    return "set -euo pipefail\n" + "\n".join(shell)


def _run(script: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        start_new_session=True,
    )


def _base_env(home: Path) -> dict[str, str]:
    """A reader's shell: the venv's commands first, nothing of the project's environment."""
    return {"PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}


@pytest.mark.slow
def test_the_getting_started_cli_blocks_run_in_an_empty_folder(tmp_path: Path) -> None:
    script = _script(DOCS / "getting-started.md", "local")
    proc = _run(script, tmp_path, _base_env(tmp_path), load_scaled(300))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    out = proc.stdout.splitlines()
    assert out[-1] == "3", "deltalake reads the 3 rows of the published table"
    assert "0" in out and "1" in out, "the two commits printed their versions"
    log = tmp_path / "lake" / "events" / "_delta_log"
    assert sorted(p.name for p in log.glob("*.json")) == [f"{v:020d}.json" for v in (0, 1)]
    assert (tmp_path / ".delta-mirror" / "store.db").is_file(), "the store is where the page says"


# -- Spark on S3 (MinIO) --------------------------------------------------------------------------


def _conf(script: str) -> dict[str, str]:
    """``--conf key=value`` pairs of the page's ``spark-submit``."""
    words = shlex.split(script.replace("\\\n", " "), comments=True)
    return dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--conf")


def _option(script: str, name: str) -> str:
    words = shlex.split(script.replace("\\\n", " "), comments=True)
    return words[words.index(name) + 1]


def test_the_spark_s3_page_names_the_packages_and_settings_delta_mirror_resolves() -> None:
    from delta_mirror.dev.spark_writer import delta_packages
    from delta_mirror.spark.s3a import s3a_settings
    from delta_mirror.spark.session import EXTRA_EXCLUDES, LOGSTORE_CLASS

    script = _script(DOCS / "spark-s3.md", "spark-s3")
    ours = {p for p in delta_packages().split(",") if not p.startswith("org.postgresql:")}
    assert set(_option(script, "--packages").split(",")) == ours
    assert _option(script, "--exclude-packages") == ",".join(EXTRA_EXCLUDES)
    conf = _conf(script)
    scoped = s3a_settings(
        "b", {"AWS_ENDPOINT_URL": "http://h:9000", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    )
    for key in ("path.style.access", "connection.ssl.enabled"):
        assert conf[f"spark.hadoop.fs.s3a.{key}"] == scoped[f"fs.s3a.bucket.b.{key}"], key
    assert {conf[f"spark.delta.logStore.{s}.impl"] for s in ("s3a", "s3")} == {LOGSTORE_CLASS}
    # the page's table (packages and settings) says the same as its spark-submit
    page = (DOCS / "spark-s3.md").read_text(encoding="utf-8")
    for package in ours:
        assert f"`{package}`" in page
    for key, value in conf.items():
        if key.startswith("spark.hadoop.fs.s3a.") and not value.startswith("$"):
            assert f"`{key.removeprefix('spark.hadoop.')}` | `{value}`" in page, key


@pytest.fixture(scope="module")
def minio() -> Any:
    from support.minio import minio_session

    yield from minio_session()


def test_the_spark_s3_example_runs_against_minio(tmp_path: Path, minio: Any) -> None:
    from delta_mirror.spark.session import ivy_dir, logstore_jar, spark_missing

    why = spark_missing()
    if why:
        skip_or_fail(f"the Spark example needs Spark: {why}")
    try:
        logstore_jar()
    except Exception as exc:  # LogStoreJarMissing: `make jar`
        skip_or_fail(f"the Spark example needs the LogStore jar: {exc}")
    page = DOCS / "spark-s3.md"
    job = [b for b in marked(page, "spark-s3") if 'title="job.py"' in b.info]
    assert len(job) == 1, "the page's job.py"
    (tmp_path / "job.py").write_text(job[0].text, encoding="utf-8")
    bucket = minio.make_bucket("delta-lake-")
    port = free_port()
    script = (
        _script(page, "spark-s3").replace("delta-lake", bucket).replace("127.0.0.1:8787", f"127.0.0.1:{port}")
    )
    script = script.replace("--port 8787", f"--port {port}")
    assert "8787" not in script
    # the environment the page's first (unmarked) block exports, with this MinIO's values
    exported = [b for b in blocks(page) if b.marker is None and b.text.startswith("export ")]
    assert len(exported) == 1
    names = set(re.findall(r"\b([A-Z_]+)=", exported[0].text))
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(f"spark.jars.ivy {ivy_dir()}\n")
    env = {
        **_base_env(tmp_path),
        **{k: v for k, v in minio.env().items() if k in names},
        "DELTA_MIRROR_STORE": f"sqlite:///{tmp_path}/store.db",
        "SPARK_CONF_DIR": str(conf_dir),
    }
    if os.environ.get("JAVA_HOME"):
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    assert set(env) >= names, f"the page exports {sorted(names)}"
    proc = _run(script, tmp_path, env, load_scaled(900))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "3" in proc.stdout.splitlines(), "the job counted 3 rows"
    keys = sorted(
        o["Key"]
        for o in minio.client().list_objects_v2(Bucket=bucket, Prefix="tables/events/_delta_log/")["Contents"]
    )
    commits = [k.rsplit("/", 1)[1] for k in keys if k.endswith(".json")]
    assert commits == [f"{v:020d}.json" for v in range(3)], keys
