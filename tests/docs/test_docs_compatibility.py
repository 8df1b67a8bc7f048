"""docs/compatibility.md's "CI runs" versions are the ones CI installs (issue 37, item 10): the
pins of requirements.txt, the emulator versions of scripts/install-emulators.sh, docker/stack.env,
and the Makefile's Spark provider. A pin changed without the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

from docs_kit import DOCS, REPO

PAGE: Path = DOCS / "compatibility.md"
#: requirements.txt names whose pinned version the matrix states (name as pinned, extras dropped)
PINNED = [
    "apache-airflow",
    "apache-airflow-providers-smtp",
    "apache-airflow-providers-postgres",
    "apache-airflow-providers-amazon",
    "apache-airflow-providers-fab",
    "apache-airflow-providers-celery",
    "celery",
    "pyspark",
    "delta-spark",
    "deltalake",
    "pyarrow",
    "sqlalchemy",
    "alembic",
    "obstore",
    "psycopg",
    "pymysql",
    "duckdb",
    "duckdb-engine",
    "duckdb-extension-delta",
    "moto",
    "playwright",
]


def _matrix() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text.split("## Versions, and which CI runs", 1)[1].split("\n## ", 1)[0]


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s#;]+)", line)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def _row(matrix: str, label: str) -> str:
    rows = [line for line in matrix.splitlines() if line.startswith(f"| {label} ")]
    assert len(rows) == 1, f"one row for {label!r} in the matrix"
    return rows[0]


def test_every_pinned_version_the_matrix_names_is_the_pin() -> None:
    matrix, pins = _matrix(), _pins()
    for name in PINNED:
        assert name in pins, f"requirements.txt no longer pins {name}: update the matrix"
        assert pins[name] in matrix, f"{name}=={pins[name]} (requirements.txt) is not in the matrix"


def test_the_airflow_and_spark_rows_name_what_ci_installs() -> None:
    matrix, pins = _matrix(), _pins()
    assert f"| {pins['apache-airflow']}, " in _row(matrix, "Airflow")
    assert f"| pyspark {pins['pyspark']} " in _row(matrix, "Spark")
    provider = re.search(r"apache-airflow-providers-apache-spark==(\S+)", (REPO / "Makefile").read_text())
    assert provider and f"apache-spark {provider.group(1)}" in _row(matrix, "Airflow")
    stack = dict(
        line.split("=", 1)
        for line in (REPO / "docker" / "stack.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert stack["SPARK_VERSION"] == pins["pyspark"] and stack["SPARK_VERSION"] in _row(matrix, "Spark")
    assert f"apache/airflow:{stack['AIRFLOW_VERSION']}-python{stack['AIRFLOW_PYTHON_VERSION']}" in matrix
    assert f"postgres:{stack['POSTGRES_VERSION']}" in matrix


def test_the_emulator_versions_are_the_ones_make_emulators_installs() -> None:
    script = (REPO / "scripts" / "install-emulators.sh").read_text(encoding="utf-8")
    matrix = _matrix()
    for var in ("AZURITE_VERSION", "FAKE_GCS_VERSION", "MINIO_VERSION"):
        m = re.search(rf'^{var}="\$\{{{var}:-([^}}]+)\}}"', script, re.M)
        assert m, var
        assert m.group(1) in matrix, f"{var} {m.group(1)} is not in the matrix"


def test_what_ci_does_not_run_says_no() -> None:
    matrix = _matrix()
    assert "| **no** |" in _row(matrix, "MySQL 8")
    assert "| **no** |" in _row(matrix, "Trino, Flink")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "mysql-server" not in ci and "mariadb-server" in ci, "CI installs MariaDB, not MySQL"
