"""Bad input (issue 40): a store whose only reachable node is a read-only standby. ``init``,
``serve`` and ``status`` given the multi-host URL (``target_session_attrs=read-write``) while the
primary is gone, and ``init`` and ``serve`` given the standby as the only host, each answer one line
naming the standby and what to give instead, exit non-zero, and change nothing. Real processes: a
primary and a streaming standby (``tests/support/pg_pair.py``), the ``delta-mirror`` executable."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import psycopg
import pytest
from support.cli import assert_one_error_line, clean_env, executable
from support.pg_pair import PgPair
from support.waiting import load_scaled, wait_until

pytestmark = pytest.mark.postgres

ADVICE = "give the primary or all hosts with target_session_attrs=read-write"


@pytest.fixture(scope="module")
def pair() -> Iterator[PgPair]:
    with PgPair.running(synchronous=False) as pair:
        yield pair


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``delta-mirror ARGS`` with the store in DELTA_MIRROR_STORE (a password stays off the command line)."""
    env = clean_env(DELTA_MIRROR_STORE=url, DELTA_MIRROR_COMMIT_TOKEN="t0ken-for-the-test")
    return subprocess.run(
        [*executable(), *args], env=env, capture_output=True, text=True, timeout=load_scaled(60)
    )


def standby_tables(pair: PgPair) -> list[str]:
    with psycopg.connect(pair.node_url(pair.standby).replace("postgresql+psycopg", "postgresql")) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return sorted(str(r[0]) for r in rows)


SERVE = ("serve", "--port", "0", "--allow-root", "file:///tmp/nowhere/")


@pytest.mark.parametrize("args", [("init",), SERVE], ids=["init", "serve"])
def test_a_standby_given_as_the_only_host_is_refused_before_any_write(
    pair: PgPair, args: tuple[str, ...]
) -> None:
    done = cli(pair.node_url(pair.standby), *args)
    assert done.returncode != 0
    assert_one_error_line(
        done.stderr, f"the store at 127.0.0.1:{pair.standby.port} is a read-only standby", ADVICE
    )
    assert pair.password not in done.stderr + done.stdout
    assert standby_tables(pair) == []


@pytest.mark.parametrize("args", [("init",), ("status",), SERVE], ids=["init", "status", "serve"])
def test_a_multi_host_url_whose_only_reachable_node_is_the_standby_is_refused(
    pair: PgPair, args: tuple[str, ...]
) -> None:
    if "primary" not in pair.killed:
        pair.kill_primary()  # the primary lost, the standby not promoted (yet)
    done = cli(pair.url, *args)
    assert done.returncode != 0
    assert_one_error_line(
        done.stderr, f"the store at 127.0.0.1:{pair.standby.port} is a read-only standby", ADVICE
    )
    assert pair.password not in done.stderr + done.stdout
    assert standby_tables(pair) == []


def test_a_write_that_reaches_a_standby_anyway_is_one_permanent_line_naming_it() -> None:
    """Past the start-up check (a node demoted under a running process): the write's SQLSTATE
    25006 is a permanent error naming the store and what to give, not a retried database error."""
    from delta_mirror.errors import PermanentError
    from delta_mirror.store import SqlStore

    pair = PgPair.start(synchronous=False)
    try:
        primary = SqlStore(pair.url)
        primary.init()
        primary.create_table("t", "file:///tmp/t")
        primary.close()
        standby = SqlStore(pair.node_url(pair.standby))

        def replayed() -> bool:
            try:
                return standby.get_table("t") is not None
            except PermanentError:  # not there yet
                return False

        wait_until(replayed, load_scaled(30), "the standby to replay the table")
        with pytest.raises(PermanentError) as caught:
            standby.create_table("u", "file:///tmp/u")
        assert caught.value.message == (
            f"the store at 127.0.0.1:{pair.standby.port} is a read-only standby — {ADVICE}"
        )
        standby.close()
    finally:
        pair.stop()
