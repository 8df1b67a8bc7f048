"""What the project derives from a store URL (``store/urls.py``): every host of a replicated
PostgreSQL store and its ``target_session_attrs`` survive into the watchers' libpq connection and
the Spark checkpoint engine's JDBC URL, in both multi-host forms; passwords stay out of messages."""

from __future__ import annotations

import psycopg.conninfo
import pytest

from delta_mirror.errors import PermanentError
from delta_mirror.store import db
from delta_mirror.store.urls import canonical, hosts, hosts_text, jdbc_url, libpq_url, read_only_host

QUERY_FORM = (
    "postgresql+psycopg://mirror:s3cr%27t@/meta?host=db1:5001&host=db2:5002&target_session_attrs=read-write"
)
COMMA_FORM = "postgresql+psycopg://mirror:s3cr%27t@db1:5001,db2:5002/meta?target_session_attrs=read-write"


def conninfo(url: str, **kwargs: bool) -> dict[str, str]:
    """The libpq conninfo as libpq itself parses it."""
    return psycopg.conninfo.conninfo_to_dict(libpq_url(url, **kwargs))  # type: ignore[return-value]


@pytest.mark.parametrize("url", [QUERY_FORM, COMMA_FORM], ids=["host-query", "comma-netloc"])
def test_both_multi_host_forms_keep_every_host_port_and_target_session_attrs_for_libpq(url: str) -> None:
    assert conninfo(url) == {
        "host": "db1,db2",
        "port": "5001,5002",
        "dbname": "meta",
        "user": "mirror",
        "password": "s3cr't",
        "target_session_attrs": "read-write",
    }


@pytest.mark.parametrize("url", [QUERY_FORM, COMMA_FORM], ids=["host-query", "comma-netloc"])
def test_both_multi_host_forms_become_one_jdbc_url_with_every_host_and_pgjdbc_target_server_type(
    url: str,
) -> None:
    jdbc, props = jdbc_url(url)
    assert jdbc == "jdbc:postgresql://db1:5001,db2:5002/meta?targetServerType=primary"
    assert props == {"driver": "org.postgresql.Driver", "user": "mirror", "password": "s3cr't"}
    assert "s3cr" not in jdbc


def test_the_comma_form_is_rewritten_into_sqlalchemys_host_query_form_that_the_engine_accepts() -> None:
    assert canonical(COMMA_FORM) == (
        "postgresql+psycopg://mirror:s3cr%27t@/meta?host=db1:5001&host=db2:5002&target_session_attrs=read-write"
    )
    assert canonical(QUERY_FORM) == QUERY_FORM
    assert canonical("sqlite:////tmp/a,b/store.db") == "sqlite:////tmp/a,b/store.db"
    engine = db.make_engine(COMMA_FORM)  # no connection yet: only that SQLAlchemy takes it
    assert engine.url.query["host"] == ("db1:5001", "db2:5002")
    engine.dispose()


def test_hosts_without_a_port_take_the_urls_port_or_libpqs_default() -> None:
    assert hosts("postgresql+psycopg://u@/meta?host=db1&host=db2:6000") == [("db1", None), ("db2", 6000)]
    assert conninfo("postgresql+psycopg://u@/meta?host=db1&host=db2:6000")["port"] == ",6000"
    assert jdbc_url("postgresql+psycopg://u@/meta?host=db1&host=db2:6000")[0] == (
        "jdbc:postgresql://db1:5432,db2:6000/meta"
    )


def test_a_message_names_every_host_and_never_the_password() -> None:
    assert hosts_text(QUERY_FORM) == "db1:5001,db2:5002"
    assert hosts_text("postgresql+psycopg://u:pw@/meta") == "localhost:5432"


def test_the_listen_connection_of_several_hosts_asks_for_the_primary_when_the_url_does_not_say() -> None:
    url = "postgresql+psycopg://u@/meta?host=db1:5001&host=db2:5002"
    assert "target_session_attrs" not in conninfo(url)
    assert conninfo(url, primary=True)["target_session_attrs"] == "read-write"
    assert "target_session_attrs" not in conninfo("postgresql+psycopg://u@db1/meta", primary=True)
    prefer = url + "&target_session_attrs=prefer-standby"
    assert conninfo(prefer, primary=True)["target_session_attrs"] == "prefer-standby"


def test_a_unix_socket_folder_and_options_survive_into_libpq() -> None:
    info = conninfo(
        "postgresql+psycopg://u@/meta?host=/var/run/postgresql&sslmode=disable&application_name=a b"
    )
    assert info == {
        "host": "/var/run/postgresql",
        "dbname": "meta",
        "user": "u",
        "sslmode": "disable",
        "application_name": "a b",
    }


@pytest.mark.parametrize(
    ("store_url", "jdbc", "props"),
    [
        pytest.param(  # credentials and options become the driver's properties
            "postgresql+psycopg://mirror:p%40ss@db.example:6543/meta?sslmode=require",
            "jdbc:postgresql://db.example:6543/meta",
            {"user": "mirror", "password": "p@ss", "sslmode": "require"},
            id="credentials-and-options",
        ),
        pytest.param(  # libpq option names PgJDBC spells its own way become its names
            "postgresql+psycopg://u@db/meta?connect_timeout=3&application_name=dm&sslmode=require",
            "jdbc:postgresql://db:5432/meta",
            {"user": "u", "connectTimeout": "3", "ApplicationName": "dm", "sslmode": "require"},
            id="pgjdbc-spellings",
        ),
    ],
)
def test_a_postgresql_store_url_becomes_a_jdbc_url_and_driver_properties(
    store_url: str, jdbc: str, props: dict[str, str]
) -> None:
    assert jdbc_url(store_url) == (jdbc, {"driver": "org.postgresql.Driver", **props})


def test_a_postgresql_url_without_host_or_port_gets_libpq_defaults_and_no_password() -> None:
    url, props = jdbc_url("postgresql+psycopg://mirror@/meta")
    assert url == "jdbc:postgresql://localhost:5432/meta"
    assert "password" not in props


@pytest.mark.parametrize(
    ("attrs", "server_type"),
    [
        ("any", "any"),
        ("read-only", "secondary"),
        ("standby", "secondary"),
        ("prefer-standby", "preferSecondary"),
    ],
)
def test_each_target_session_attrs_has_its_pgjdbc_spelling(attrs: str, server_type: str) -> None:
    url, _ = jdbc_url(f"postgresql+psycopg://u@/meta?host=a:1&host=b:2&target_session_attrs={attrs}")
    assert url == f"jdbc:postgresql://a:1,b:2/meta?targetServerType={server_type}"


def test_bad_urls_are_one_clear_line() -> None:
    with pytest.raises(PermanentError, match="no JDBC mapping for a sqlite store"):
        jdbc_url("sqlite:///tmp/store.db")
    with pytest.raises(PermanentError, match="unknown target_session_attrs='sometimes'"):
        jdbc_url("postgresql+psycopg://u@/meta?host=a:1&target_session_attrs=sometimes")
    with pytest.raises(PermanentError, match="port that is not a number: 'x'"):
        libpq_url("postgresql+psycopg://u:pw@db1:x,db2:5002/meta")


def test_libpqs_skipped_standby_is_named_from_its_connection_failure() -> None:
    message = (
        'connection failed: connection to server at "127.0.0.1", port 5001 failed: Connection refused\n'
        "\tIs the server running on that host and accepting TCP/IP connections?\n"
        'Multiple connection attempts failed. ... connection to server at "127.0.0.1", port 5002 failed: '
        "session is read-only"
    )
    assert read_only_host(message) == "127.0.0.1:5002"
    assert read_only_host('connection to server at "h", port 1 failed: Connection refused') is None


@pytest.mark.postgres
def test_the_comma_form_with_the_standby_first_reaches_the_primary_for_the_store_and_listen() -> None:
    """Real servers (a primary and a streaming standby): the store's engine and the libpq
    connection both skip the standby listed first and write to, and listen on, the primary."""
    from urllib.parse import quote

    from support.pg_pair import APP_DB, APP_ROLE, PgPair

    from delta_mirror.store import SqlStore

    pair = PgPair.start(synchronous=False)
    try:
        url = (
            f"postgresql+psycopg://{APP_ROLE}:{quote(pair.password, safe='')}@127.0.0.1:{pair.standby.port},"
            f"127.0.0.1:{pair.primary.port}/{APP_DB}?target_session_attrs=read-write"
        )
        store = SqlStore(url)
        store.init()
        store.create_table("t", "file:///tmp/t")
        store.close()
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            assert conn.info.port == pair.primary.port
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
            conn.execute("LISTEN delta_mirror_commits")
            assert conn.execute("SELECT count(*) FROM dl_tables").fetchone() == (1,)
    finally:
        pair.stop()


def test_messages_redact_the_comma_form_like_any_store_url() -> None:
    from delta_mirror.config import redact_url

    assert redact_url(COMMA_FORM) == (
        "postgresql+psycopg://mirror:***@/meta?host=db1%3A5001&host=db2%3A5002&target_session_attrs=read-write"
    )
