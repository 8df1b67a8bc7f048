"""``status`` and ``health`` against the table config (health/coverage.py), on real SQLite and
PostgreSQL stores: a table no config entry names is "not configured: no DAG publishes it" instead
of a growing lag, and ``health`` does not fail it for lag; a configured table the store lacks is
"not in store", and every command that would publish it refuses it in one line naming the config
file and what to do, writing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import update
from store.store_kit import state as store_state
from support.builders import METADATA, PROTOCOL, add, lines
from support.cli import assert_one_error_line, clean_env, executable

from delta_mirror.cli import cli
from delta_mirror.delta.protocol import now_ms
from delta_mirror.health.coverage import NOT_CONFIGURED
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_commits

CREATE = lines(PROTOCOL, METADATA, add("a.parquet"))
HOUR = 3600.0


def cli_run(config: Path | str, *args: str, stdin: bytes | None = None) -> Result:
    """The command in-process with ``DELTA_MIRROR_CONFIG`` at ``config``."""
    env = {"DELTA_MIRROR_CONFIG": str(config), "DELTA_MIRROR_STORE": None, "DELTA_MIRROR_HOME": None}
    return CliRunner().invoke(cli, list(args), input=stdin, env=env)


@pytest.fixture
def fleet(store_url: str, tmp_path: Path) -> tuple[str, Path]:
    """A store with ``sales`` (configured) and ``events`` (created by `commit --location`, in no
    config entry), each one version behind; a config naming ``sales`` and ``orders`` (which the
    store has never had), with a 5-minute lag SLO."""
    config = tmp_path / "delta_mirror.yaml"
    config.write_text("defaults:\n  lag_slo: 5m\ntables:\n  sales: {}\n  orders: {}\n", encoding="utf-8")
    assert cli_run(config, "--store", store_url, "init").exit_code == 0
    for name in ("sales", "events"):
        args = ("--store", store_url, "commit", name, "--actions", "-", "--location", str(tmp_path / name))
        result = cli_run(config, *args, stdin=CREATE)
        assert result.exit_code == 0, result.output
    return store_url, config


def _age_commits(url: str, name: str, seconds: float) -> None:
    store = SqlStore(url)
    try:
        table_id = store.get_table(name).id
        with store.engine.begin() as conn:
            conn.execute(
                update(dl_commits)
                .where(dl_commits.c.table_id == table_id)
                .values(committed_at=now_ms() - int(seconds * 1000))
            )
    finally:
        store.close()


def _rows(output: str) -> dict[str, list[str]]:
    """``status`` text: each table's row and the indented lines under it."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in output.splitlines()[1:]:
        if line.startswith("  "):
            out[current].append(line.strip())
        elif not line.startswith("("):  # the --limit footer
            current = line.split()[0]
            out[current] = [line]
    return out


def test_status_says_not_configured_instead_of_a_lag_for_a_table_no_config_names(
    fleet: tuple[str, Path],
) -> None:
    url, config = fleet
    _age_commits(url, "events", HOUR)

    text = cli_run(config, "--store", url, "status")
    assert text.exit_code == 0, text.output
    rows = _rows(text.stdout)
    assert list(rows) == ["events", "orders", "sales"]
    events = rows["events"]
    assert events[0].split()[1:6] == ["ACTIVE", "0", "-", "-", "-"]  # no BEHIND, no LAG_S
    assert events[1:] == [
        f"{NOT_CONFIGURED} (1 version(s) not published) — to mirror it, list it under `tables:` in {config}"
    ]
    assert rows["sales"][0].split()[1:5] == ["ACTIVE", "0", "-", "1"] and len(rows["sales"]) == 1

    every = json.loads(cli_run(config, "--store", url, "status", "--json").stdout)
    by_name = {r["table"]: r for r in every}
    assert (by_name["events"]["configured"], by_name["events"]["in_store"]) == (False, True)
    assert by_name["events"]["note"].startswith(f"{NOT_CONFIGURED} (1 version(s) not published)")
    # the figures are still there (what nobody publishes), nothing judges them
    assert by_name["events"]["versions_behind"] == 1 and by_name["events"]["lag_seconds"] >= HOUR
    assert (by_name["sales"]["configured"], by_name["sales"]["note"]) == (True, None)
    one = json.loads(cli_run(config, "--store", url, "status", "events", "--json").stdout)
    assert one["configured"] is False and one["note"] == by_name["events"]["note"]


def test_status_shows_a_configured_table_the_store_lacks_as_not_in_store(fleet: tuple[str, Path]) -> None:
    url, config = fleet
    text = cli_run(config, "--store", url, "status")
    (orders,) = _rows(text.stdout)["orders"]
    assert orders.split()[0] == "orders"
    assert orders.split(maxsplit=1)[1].startswith(
        f"not in store: configured in {config}, but the store has no such table — commit its first version"
    )
    every = json.loads(cli_run(config, "--store", url, "status", "--json").stdout)
    entry = next(r for r in every if r["table"] == "orders")
    assert (entry["state"], entry["in_store"], entry["configured"]) == ("NOT_IN_STORE", False, True)
    assert "delta-mirror import <root> --table orders" in entry["note"]
    # --limit counts it with the store's tables (by name)
    limited = cli_run(config, "--store", url, "status", "--limit", "2")
    assert list(_rows(limited.stdout)) == ["events", "orders"]
    assert "(2 of 3 tables shown: --limit 2)" in limited.stdout


def test_health_does_not_fail_a_table_no_dag_publishes_for_its_lag(fleet: tuple[str, Path]) -> None:
    url, config = fleet
    _age_commits(url, "events", HOUR)  # twelve times the 5m SLO

    result = cli_run(config, "--store", url, "health")
    assert result.exit_code == 0, result.output
    assert "OK   events: not configured, 1 version(s) not published, state ACTIVE" in result.stdout
    assert f"  ~ {NOT_CONFIGURED} (1 version(s) not published)" in result.stdout
    assert "OK   orders: not in store" in result.stdout
    assert result.stdout.endswith("healthy\n")

    report = json.loads(cli_run(config, "--store", url, "health", "--json").stdout)
    by_name = {t["table"]: t for t in report["tables"]}
    assert list(by_name) == ["events", "orders", "sales"]
    assert by_name["events"]["healthy"] and by_name["events"]["problems"] == []
    assert by_name["events"]["warnings"][0].startswith(NOT_CONFIGURED)
    assert by_name["orders"]["healthy"] and "not in store" in by_name["orders"]["warnings"][0]

    # the same lag on a configured table still fails
    _age_commits(url, "sales", HOUR)
    failing = cli_run(config, "--store", url, "health")
    assert failing.exit_code == 1
    assert "FAIL sales: lag" in failing.stdout and "breaches the lag SLO of 300 s" in failing.stdout


def test_without_a_table_config_every_table_keeps_its_lag(fleet: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = fleet
    absent = tmp_path / "absent.yaml"
    _age_commits(url, "events", HOUR)
    rows = _rows(cli_run(absent, "--store", url, "status").stdout)
    assert list(rows) == ["events", "sales"] and rows["events"][0].split()[4] == "1"
    entry = json.loads(cli_run(absent, "--store", url, "status", "events", "--json").stdout)
    assert (entry["configured"], entry["note"]) == (None, None)
    health = cli_run(absent, "--store", url, "health")
    assert health.exit_code == 1 and "FAIL events: lag" in health.stdout  # the 15m default SLO


def _missing_line(stderr: str, config: Path) -> str:
    return assert_one_error_line(
        stderr,
        f"table 'orders': not in store: configured in {config}, but the store has no such table",
        "commit its first version",
        "`delta-mirror import <root> --table orders`",
        f"or fix the name in {config}",
    )


@pytest.mark.parametrize(
    "command",
    [
        ("mirror", "orders"),
        ("sync", "orders"),
        ("checkpoint", "orders"),
        ("status", "orders"),
        ("health", "orders"),
    ],
    ids=lambda c: c[0],
)
def test_a_configured_table_the_store_lacks_is_one_line_and_nothing_is_written(
    fleet: tuple[str, Path], tmp_path: Path, command: tuple[str, ...]
) -> None:
    url, config = fleet
    store = SqlStore(url)
    before = (store_state(store), sorted(p.name for p in tmp_path.iterdir()))

    result = cli_run(config, "--store", url, *command)

    assert result.exit_code == 1, result.output
    _missing_line(result.stderr, config)
    assert result.stdout == ""
    assert (store_state(store), sorted(p.name for p in tmp_path.iterdir())) == before
    store.close()


def test_the_missing_table_line_names_the_config_the_command_was_given(
    fleet: tuple[str, Path], tmp_path: Path
) -> None:
    url, config = fleet
    other = tmp_path / "other.yaml"
    other.write_text("tables:\n  orders: {store_conn_id: dm_orders}\n", encoding="utf-8")
    result = cli_run(config, "--store", url, "mirror", "orders", "--config", str(other))
    line = _missing_line(result.stderr, other)
    assert "its entry reads the store of connection 'dm_orders'" in line
    # a name no config lists: the store's own line
    typo = cli_run(config, "--store", url, "mirror", "ordrs")
    assert typo.exit_code == 1
    assert_one_error_line(typo.stderr, "no table named 'ordrs' in the store", "import/commit")


def test_the_real_executable_refuses_a_configured_table_the_store_lacks(fleet: tuple[str, Path]) -> None:
    import subprocess

    url, config = fleet
    env = clean_env(DELTA_MIRROR_CONFIG=str(config), DELTA_MIRROR_STORE=url)
    proc = subprocess.run(
        [*executable(), "mirror", "orders"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 1 and proc.stdout == ""
    _missing_line(proc.stderr, config)


def test_the_triggerers_sync_refuses_a_configured_table_the_store_lacks_with_the_same_line(
    fleet: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The triggerer's path (``publish_in="triggerer"``) looks the table up before the publisher
    does: the same line as every other command, not the store's generic one."""
    from delta_mirror.errors import TableNotFoundError
    from delta_mirror.jobs.sync import sync_table

    url, config = fleet
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(config))
    store = SqlStore(url)
    before = store_state(store)
    with pytest.raises(TableNotFoundError) as raised:
        sync_table(store, "orders", publish_in="triggerer")
    assert f"configured in {config}" in str(raised.value)
    assert store_state(store) == before
    store.close()
