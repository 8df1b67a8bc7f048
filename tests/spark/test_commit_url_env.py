"""One variable for the commit-service URLs (issue 40): ``DELTA_MIRROR_COMMIT_URL`` takes one URL or
every replica's, comma-separated, and reaches the LogStore as the one list it fails over across
(``spark.hadoop.delta.mirror.commit.url``). The older ``DELTA_MIRROR_COMMIT_URLS`` is read when the
first is unset, with one warning. No Spark session: only the settings ``get_spark()`` starts with."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from delta_mirror.errors import PermanentError
from delta_mirror.spark import session
from delta_mirror.spark.session import AuthorityConfig, authority_conf, commit_url_from_env

TWO = "http://127.0.0.1:8787,http://127.0.0.1:8788"


@pytest.fixture(autouse=True)
def fresh_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "_warned_alias", False)


def test_a_single_url_stays_valid() -> None:
    assert commit_url_from_env({"DELTA_MIRROR_COMMIT_URL": " http://mirror:8787/ "}) == "http://mirror:8787"


def test_every_replica_listed_reaches_the_logstore_as_its_one_url_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jar = tmp_path / "delta-mirror-logstore.jar"
    jar.write_bytes(b"")
    monkeypatch.setenv("DELTA_MIRROR_LOGSTORE_JAR", str(jar))
    authority = AuthorityConfig.from_env(
        {
            "DELTA_MIRROR_COMMIT_URL": "http://127.0.0.1:8787, http://127.0.0.1:8788/",
            "DELTA_MIRROR_COMMIT_ROOTS": "s3a://lake/",
        }
    )
    assert authority == AuthorityConfig(url=TWO, roots=("s3a://lake/",))
    assert authority_conf(authority)["spark.hadoop.delta.mirror.commit.url"] == TWO


def test_the_old_plural_variable_is_read_when_the_one_variable_is_unset_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "delta_mirror.spark.session")
    assert commit_url_from_env({"DELTA_MIRROR_COMMIT_URLS": TWO}) == TWO
    assert commit_url_from_env({"DELTA_MIRROR_COMMIT_URLS": TWO}) == TWO
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "DELTA_MIRROR_COMMIT_URLS is deprecated and read for now: set DELTA_MIRROR_COMMIT_URL to the"
        " comma-separated list instead"
    ]


def test_the_one_variable_wins_over_the_old_plural_one(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "delta_mirror.spark.session")
    env = {"DELTA_MIRROR_COMMIT_URL": TWO, "DELTA_MIRROR_COMMIT_URLS": "http://127.0.0.1:8787"}
    assert commit_url_from_env(env) == TWO
    assert "ignored beside DELTA_MIRROR_COMMIT_URL" in caplog.text


def test_no_variable_is_no_authority() -> None:
    assert commit_url_from_env({}) is None
    assert commit_url_from_env({"DELTA_MIRROR_COMMIT_URL": " , "}) is None
    assert AuthorityConfig.from_env({}) is None


def test_an_entry_that_is_not_an_http_url_is_one_line_naming_the_variable_and_no_credentials() -> None:
    with pytest.raises(PermanentError) as caught:
        commit_url_from_env({"DELTA_MIRROR_COMMIT_URL": "http://127.0.0.1:8787,user:secret@mirror-b:8787"})
    assert caught.value.message.splitlines() == [caught.value.message]
    assert (
        "DELTA_MIRROR_COMMIT_URL holds 'mirror-b:8787', which is not an http(s):// URL"
        in caught.value.message
    )
    assert "secret" not in caught.value.message
