"""A service or tool the suite needs that is missing: under ``CI=true`` the test fails with the
reason (``.ci/run`` installs every one, so a missing one is a broken run, not a skip); elsewhere it
is skipped with the reason."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import services
from support.azurite import AZURITE_ENV, azurite_session
from support.fake_gcs import FAKE_GCS_ENV, fake_gcs_session
from support.minio import MINIO_ENV, minio_session
from support.services import ServiceUnavailable, in_ci, session_service, skip_or_fail

REASON = "frobnicator not found: apt-get install frobnicator"


@pytest.mark.parametrize("value", ["true", "TRUE", "1"])
def test_under_ci_a_missing_service_fails_the_test_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci()
    with pytest.raises(pytest.fail.Exception, match=REASON):
        skip_or_fail(REASON)


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_outside_ci_a_missing_service_skips_the_test_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not in_ci()
    with pytest.raises(pytest.skip.Exception, match=REASON):
        skip_or_fail(REASON)


def test_a_session_service_that_cannot_start_fails_under_ci_and_skips_outside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stopped: list[object] = []

    def start() -> object:
        raise ServiceUnavailable(REASON)

    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=REASON):
        next(session_service(start, stopped.append))
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match=REASON):
        next(session_service(start, stopped.append))
    assert stopped == []  # nothing started, nothing to stop


@pytest.mark.parametrize(
    ("env_var", "session", "named"),
    [
        (MINIO_ENV, minio_session, "MinIO"),
        (AZURITE_ENV, azurite_session, "Azurite"),
        (FAKE_GCS_ENV, fake_gcs_session, "fake-gcs-server"),
    ],
    ids=["minio", "azurite", "fake-gcs-server"],
)
def test_an_emulator_binary_that_is_not_there_fails_its_tests_under_ci(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    env_var: str,
    session: Callable[[], Iterator[Any]],
    named: str,
) -> None:
    """The binary override points nowhere: the session fixture's body fails naming the server and
    how to install it (CI), or skips with the same words (a developer's machine)."""
    monkeypatch.setattr(services, "unmarked_test", [])  # make check's guard: nothing can start here
    monkeypatch.setenv(env_var, str(tmp_path / "nowhere" / "server"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=f"{named}.*not found.*install-emulators.sh"):
        next(session())
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match=f"{named}.*not found"):
        next(session())
