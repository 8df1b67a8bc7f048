"""``delta-mirror status`` / ``health`` as processes tell the truth (issue 28): a table that cannot
publish shows its error at once and fails ``health`` past the failure grace; ``--json`` carries the
per-version latency percentiles read from the store."""

from __future__ import annotations

import json
import subprocess
from contextlib import closing
from pathlib import Path

import pytest
from support.cli import clean_env, executable
from support.stores import init_store

V0 = (
    '{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}\n'
    '{"metaData":{"id":"a1b2c3d4-0000-0000-0000-000000000001","format":{"provider":"parquet","options":{}},'
    '"schemaString":"{\\"type\\":\\"struct\\",\\"fields\\":[{\\"name\\":\\"id\\",\\"type\\":\\"long\\",'
    '\\"nullable\\":true,\\"metadata\\":{}}]}","partitionColumns":[],"configuration":{},'
    '"createdTime":1700000000000}}\n'
)


def _dm(url: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*executable(), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=clean_env(DELTA_MIRROR_STORE=url, DELTA_MIRROR_CONFIG=str(cwd / "no-config.yaml")),
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def failing_table(store_url: str, tmp_path: Path) -> str:
    """Table ``t`` whose location is a folder inside a regular file; one version to publish.

    Made in-process (``init`` and ``commit`` are not what is tested here: two processes saved)."""
    (tmp_path / "blocker").write_text("a regular file")
    with closing(init_store(store_url)) as store:
        store.create_table("t", (tmp_path / "blocker" / "t").as_uri())
        store.commit("t", [(k, b) for line in V0.splitlines() for k, b in json.loads(line).items()])
    return store_url


def test_a_table_that_cannot_publish_shows_its_error_and_fails_health_past_the_grace(
    failing_table: str, tmp_path: Path
) -> None:
    url = failing_table
    mirror = _dm(url, "mirror", "t", cwd=tmp_path)
    assert mirror.returncode == 1 and "Not a directory" in mirror.stderr

    status = _dm(url, "status", cwd=tmp_path)
    assert status.returncode == 0
    assert "publishing failed 1 attempt(s) in a row" in status.stdout
    assert "[PERMANENT]" in status.stdout and "Not a directory" in status.stdout
    as_json = json.loads(_dm(url, "status", "t", "--json", cwd=tmp_path).stdout)
    assert as_json["failure"]["attempts"] == 1 and "Not a directory" in as_json["failure"]["error"]
    assert as_json["failure"]["error_class"] == "PERMANENT" and as_json["failure"]["first_failed_at"] > 0

    # one failed attempt, a second ago: within the default grace (2 attempts or 5 minutes)
    within = _dm(url, "health", cwd=tmp_path)
    assert within.returncode == 0, within.stdout
    assert (
        "~ publishing failed 1 attempt(s)" in within.stdout
        and "unhealthy after 2 attempt(s)" in within.stdout
    )
    # the grace from the command line
    strict = _dm(url, "health", "--failure-grace-attempts", "1", cwd=tmp_path)
    assert strict.returncode == 1 and "UNHEALTHY" in strict.stdout
    assert (
        _dm(url, "health", "--failure-grace", "0s", "--failure-grace-attempts", "9", cwd=tmp_path).returncode
        == 1
    )
    bad = _dm(url, "health", "--failure-grace", "soon", cwd=tmp_path)
    assert bad.returncode != 0 and "--failure-grace: expected a duration" in bad.stderr

    # the grace from the table config's defaults
    config = tmp_path / "grace.yaml"
    config.write_text("defaults: {failure_grace_attempts: 1}\ntables: {}\n")
    assert _dm(url, "health", "--config", str(config), cwd=tmp_path).returncode == 1

    assert _dm(url, "mirror", "t", cwd=tmp_path).returncode == 1
    past = _dm(url, "health", "--json", cwd=tmp_path)
    assert past.returncode == 1
    (table,) = json.loads(past.stdout)["tables"]
    assert table["healthy"] is False
    assert any("publishing failed 2 attempt(s) in a row" in p for p in table["problems"])


def test_status_and_health_json_carry_latency_percentiles_and_a_success_clears_the_failure(
    failing_table: str, tmp_path: Path
) -> None:
    url = failing_table
    assert _dm(url, "mirror", "t", cwd=tmp_path).returncode == 1
    (tmp_path / "blocker").unlink()  # the cause fixed: the location can be made
    published = _dm(url, "mirror", "t", cwd=tmp_path)
    assert published.returncode == 0, published.stderr

    status = json.loads(_dm(url, "status", "t", "--json", cwd=tmp_path).stdout)
    assert status["failure"] is None and status["last_published"] == 0
    for window in ("1h", "24h", "7d"):
        stats = status["latency"][window]
        assert stats["versions"] == 1
        # committed before the failed attempt, readable after the second: at least a few ms, well under a minute
        assert 0 < stats["p50"] == stats["p95"] == stats["p99"] == stats["max"] < 60
    text = _dm(url, "status", cwd=tmp_path).stdout
    assert "publishing failed" not in text
    health = _dm(url, "health", "--json", cwd=tmp_path)
    assert health.returncode == 0
    (table,) = json.loads(health.stdout)["tables"]
    assert table["status"]["latency"]["24h"]["versions"] == 1 and table["warnings"] == []
