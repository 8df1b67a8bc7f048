"""Fixtures for the end-to-end tests: one real Airflow per module, an SMTP server, a SQLite store.

``DELTA_MIRROR_E2E_METADATA=postgres`` puts Airflow's own metadata DB on the throwaway PostgreSQL
server instead of SQLite (both work with ``airflow standalone`` and the LocalExecutor in 3.3.2).
When a test fails, the Airflow logs are copied to ``test-artifacts/airflow-e2e/<test>/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e_stack import SmtpServer, save_artifacts
from support.services import session_service


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="module")
def smtp() -> Iterator[SmtpServer]:
    yield from session_service(SmtpServer, SmtpServer.stop)


@pytest.fixture(scope="module")
def e2e_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("airflow-e2e")


@pytest.fixture(autouse=True)
def _save_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    env = getattr(request.node, "funcargs", {}).get("airflow")
    rep = getattr(request.node, "rep_call", None)
    if env is not None and rep is not None and rep.failed:
        dest = save_artifacts(env.stack, request.node.name)
        print(f"\nAirflow logs saved to {dest}")
