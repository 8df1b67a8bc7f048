"""The hook turns Airflow connections into core objects, and their secrets never reach a log.

Connections are defined the way deployments often do it: ``AIRFLOW_CONN_<ID>`` variables (a URI
for Postgres, JSON for AWS with an ``endpoint_url`` extra).

About logs: ``dag.test()`` / ``airflow dags test`` print task logs to the console *without* Airflow's
secrets masker (in 3.3.2 the masking runs where a real worker's supervisor writes
``$AIRFLOW_HOME/logs``; these runs write no files there). So two things are checked: nothing
delta-mirror logs, returns or renders contains a secret at all (no masking needed), and every
secret the hook hands to the core is registered with the masker (masked in a real worker's log).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from dm_airflow_kit import S3Writer, make_table, run_dag
from support.services import S3Server

from delta_mirror.store import SqlStore

if TYPE_CHECKING:
    from delta_mirror.airflow.hooks import DeltaMirrorHook

PG_SECRET = "pg-Pa55w0rd-7c1e9b44d2"
AWS_SECRET = "aws-S3cr3t-f04a9d7b61e2"


def hook(**kwargs: str | None) -> DeltaMirrorHook:
    from delta_mirror.airflow.hooks import DeltaMirrorHook

    return DeltaMirrorHook(**kwargs)


def test_a_postgres_connection_becomes_the_store_url(
    monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_DM_STORE", "postgres://mirror:p%40ss@db.internal:6543/delta")
    assert (
        hook(store_conn_id="dm_store").store_url
        == "postgresql+psycopg://mirror:p%40ss@db.internal:6543/delta"
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_URL",
        json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": "sqlite:////tmp/x.db"}}),
    )
    assert hook(store_conn_id="dm_url").store_url == "sqlite:////tmp/x.db"


def test_a_mysql_connection_becomes_a_mysql_store_url(
    monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_DM_MYSQL", "mysql://mirror:p%40ss@db.internal:3306/delta")
    assert hook(store_conn_id="dm_mysql").store_url == "mysql+pymysql://mirror:p%40ss@db.internal:3306/delta"


def test_without_a_store_connection_the_store_is_delta_mirror_store(
    monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    monkeypatch.setenv("DELTA_MIRROR_STORE", "sqlite:////tmp/default.db")
    assert hook().store_url == "sqlite:////tmp/default.db"
    assert hook(store_conn_id="None").store_url == "sqlite:////tmp/default.db"  # a rendered template
    assert hook().storage_options == {}


def test_an_aws_connection_becomes_object_store_options(
    monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "AKIAEXAMPLE",
                "password": "secret",
                "extra": {
                    "endpoint_url": "http://127.0.0.1:9000",
                    "region_name": "eu-west-1",
                    "aws_session_token": "token",
                },
            }
        ),
    )
    assert hook(aws_conn_id="dm_s3").storage_options == {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "token",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-1",
    }
    # the Amazon provider's other spellings: keys in the extras, endpoint under service_config.s3
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "extra": {
                    "aws_access_key_id": "AKIA2",
                    "aws_secret_access_key": "secret2",
                    "service_config": {"s3": {"endpoint_url": "https://s3.example.com"}},
                },
            }
        ),
    )
    assert hook(aws_conn_id="dm_s3").storage_options == {
        "AWS_ACCESS_KEY_ID": "AKIA2",
        "AWS_SECRET_ACCESS_KEY": "secret2",
        "AWS_ENDPOINT_URL": "https://s3.example.com",
    }


def _leaks(secret: str, texts: dict[str, str]) -> list[str]:
    return [where for where, text in texts.items() if secret in text]


@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.usefixtures("airflow_db")
def test_connection_secrets_never_appear_in_task_logs(
    dm_config: Callable[..., Path],
    pg_store_url: str,
    s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from sqlalchemy.engine import make_url

    bucket = s3.make_bucket()
    store = SqlStore(pg_store_url)
    store.init()
    make_table(store, "secret_t", f"s3://{bucket}/t", versions=2, s3=S3Writer(s3.client(), bucket, "t"))
    store.create_table("unreachable", f"s3://{bucket}/u")
    pg = make_url(pg_store_url)
    # the throwaway server trusts local connections: any password is accepted, so it is sent for real
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_STORE", f"postgres://{pg.username}:{PG_SECRET}@{pg.host}:{pg.port}/{pg.database}"
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": s3.access_key,
                "password": AWS_SECRET,  # moto does not check signatures
                "extra": {"endpoint_url": s3.endpoint, "region_name": s3.region},
            }
        ),
    )
    # a store the operators cannot reach, with the same password: failures must not print it either
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_DOWN", f"postgres://{pg.username}:{PG_SECRET}@127.0.0.1:9/{pg.database}"
    )
    dm_config(
        {
            "secret_t": {"store_conn_id": "dm_store", "aws_conn_id": "dm_s3"},
            "down": {"store_conn_id": "dm_down", "aws_conn_id": "dm_s3", "retries": 0},
        }
    )

    ok = run_dag("delta_mirror__secret_t")
    failed = run_dag("delta_mirror__down")

    assert ok.states() == {
        "publish": "success",
        "checkpoint": "success",
        "validate": "success",
        "metrics": "success",
    }
    assert failed.tasks["publish"].state == "failed"
    out = capfd.readouterr()
    texts = {"stdout": out.out, "stderr": out.err}
    assert "published 2 version(s) of secret_t" in out.out + out.err  # the task logs were captured
    assert "127.0.0.1:9" in out.out + out.err or "port 9" in out.out + out.err  # and the failure's
    logs = Path(os.environ["AIRFLOW_HOME"]) / "logs"
    for path in logs.rglob("*") if logs.exists() else []:
        if path.is_file():
            texts[str(path)] = path.read_text(errors="replace")
    texts["xcom"] = json.dumps([ok.xcom(t) for t in ("publish", "validate", "metrics")])

    from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
    from airflow.utils.session import create_session

    with create_session() as session:
        texts["rendered fields"] = json.dumps(
            [r.rendered_fields for r in session.query(RTIF).all()], default=str
        )

    assert _leaks(PG_SECRET, texts) == []
    assert _leaks(AWS_SECRET, texts) == []
    store.close()


def test_every_secret_the_hook_uses_is_registered_with_the_secrets_masker(
    monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    from airflow.sdk._shared.secrets_masker import redact

    url_secret, aws_secret, token = "url-Secr3t-91d0c2", "aws-Secr3t-5e7a11", "tok-Secr3t-3b8f60"
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_URL",
        json.dumps(
            {"conn_type": "postgres", "extra": {"sqlalchemy_url": f"postgresql://u:{url_secret}@h/db"}}
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_S3",
        json.dumps(
            {"conn_type": "aws", "login": "k", "password": aws_secret, "extra": {"aws_session_token": token}}
        ),
    )
    h = hook(store_conn_id="dm_url", aws_conn_id="dm_s3")
    line = f"store {h.store_url} options {h.storage_options}"
    assert url_secret in line and aws_secret in line and token in line
    masked = redact(line)
    assert url_secret not in masked and aws_secret not in masked and token not in masked
    assert "***" in masked
    assert redact(f"password was {url_secret}") == "password was ***"


def test_a_duckdb_store_is_refused_for_airflow_in_one_line_before_its_file_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    """Airflow's scheduler, triggerer and workers are separate processes; a DuckDB file takes one
    read-write process. Every Airflow path resolves the store through the hook's ``store_url``."""
    from delta_mirror.errors import PermanentError

    path = tmp_path / "store.duckdb"
    url = f"duckdb:///{path}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_DUCK", json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": url}})
    )
    monkeypatch.setenv("DELTA_MIRROR_STORE", url)
    for h in (hook(store_conn_id="dm_duck"), hook()):
        with pytest.raises(PermanentError) as info:
            h.store  # noqa: B018 (the property opens the store)
        message = str(info.value)
        assert "\n" not in message
        assert f"the DuckDB store {path}" in message and "Airflow" in message
        assert "use a PostgreSQL or MySQL store for Airflow" in message
    assert not path.exists()  # refused before anything opened (and locked) the file
