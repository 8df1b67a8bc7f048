"""No requirement of ours is tighter than Airflow's own on a library Airflow also uses.

delta-mirror goes into a team's Airflow: a cap of ours on uvicorn, starlette, SQLAlchemy, pyarrow, ...
would pin their API server or scheduler to it. The rule, for every distribution that the installed
``apache-airflow-core`` (and its task SDK) also requires: our specifier refuses no version theirs
allows above our own lower bound. Lower bounds of ours may be higher than theirs. The built wheel's
METADATA is checked the same way in ``test_installed_wheel.py``.
"""

from __future__ import annotations

import tomllib

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from support.packaging import REPO, airflow_requirements, capped_tighter_than, excluded_versions


def pyproject_requirements() -> tuple[list[str], list[str]]:
    """``dependencies`` and every optional dependency (as ``; extra == '<name>'``), and the extras."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = list(project["dependencies"])
    extras = project["optional-dependencies"]
    for extra, deps in extras.items():
        for dep in deps:
            text, _, marker = dep.partition(";")
            condition = f"extra == '{extra}'" + (f" and ({marker.strip()})" if marker.strip() else "")
            lines.append(f"{text.strip()}; {condition}")
    return lines, sorted(extras)


def test_pyproject_caps_no_library_tighter_than_airflow() -> None:
    ours, extras = pyproject_requirements()
    assert capped_tighter_than(ours, airflow_requirements(), extras) == []


def test_a_planted_uvicorn_cap_is_caught() -> None:
    ours, extras = pyproject_requirements()
    planted = [*ours, "uvicorn>=0.54,<0.55; extra == 'service'"]
    (problem,) = capped_tighter_than(planted, airflow_requirements(), extras)
    assert problem.startswith("uvicorn<0.55,>=0.54 refuses 0.55"), problem
    assert "allowed by uvicorn>=0.37.0" in problem


@pytest.mark.parametrize(
    ("ours", "theirs", "refused"),
    [
        (
            "<2.2,>=2.0",
            ">=2.0.50",
            ["2.2", "2.2.1", "2.3", "3", "10000"],
        ),  # the sqlalchemy cap this package had
        ("==0.54.0", ">=0.37.0", ["0.54.1", "0.55", "1", "10000"]),  # an exact pin
        (">=1.1,!=1.2.0", ">=1.0", ["1.2.0"]),  # a hole Airflow does not have
        ("<3", ">=2.0,<3", []),  # the same cap as Airflow's
        (">=1.13", "<2.0,>=1.13.1", []),  # lower bounds only: theirs keeps its cap
        (">=2.0", ">=2.0.50", []),
        ("~=1.5", ">=1.0", ["2", "10000"]),  # compatible release caps at the next major
    ],
)
def test_excluded_versions_are_those_airflow_allows_and_we_refuse(
    ours: str, theirs: str, refused: list[str]
) -> None:
    assert excluded_versions(SpecifierSet(ours), SpecifierSet(theirs)) == [Version(v) for v in refused]


def test_a_requirement_of_another_platform_or_python_does_not_count() -> None:
    theirs = ["uvicorn>=0.37.0", "asgiref>=3.11.1; python_version >= '3.99'"]
    ours = ["asgiref<3; extra == 'service'", "uvicorn<0.40; sys_platform == 'no-such-platform'"]
    assert capped_tighter_than(ours, theirs, ["service"]) == []
