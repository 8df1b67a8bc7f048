"""Issue 39 finding 7: the "Delta Mirror" page never tells a user without access which table names
are configured. Every name it may not read gets the one refusal (``ui_app.FORBIDDEN``), a
configured one as an unknown one; a user who may read tables without a DAG gets for a configured
table it may not read the same 404 as for an unknown name. Checked on ``ui_app``'s own refusals
with an auth manager that grants DAGs by name (the FAB server's version is test_ui_auth.py)."""

from __future__ import annotations

from typing import Any

import pytest
from dm_airflow_kit import config_yaml
from fastapi import HTTPException

from delta_mirror.airflow import ui_app
from delta_mirror.table_config import parse_config

CONFIGURED = ["payroll", "orders"]
UNKNOWN = ["no-such-table", "payroll2", "delta_mirror__payroll"]


class Grants:
    """An auth manager that lets its user read the DAGs named, and the configuration when told."""

    def __init__(self, dags: set[str], configuration: bool) -> None:
        self.dags, self.configuration = dags, configuration

    def filter_authorized_dag_ids(self, *, dag_ids: set[str], user: Any, method: str) -> set[str]:
        return dag_ids & self.dags

    def is_authorized_dag(self, *, method: str, details: Any, user: Any) -> bool:
        return str(details.id) in self.dags

    def is_authorized_configuration(self, *, method: str, user: Any) -> bool:
        return self.configuration


def refusal(access: ui_app.TableAccess, name: str) -> tuple[int, str]:
    """The status and text the page answers for ``name``, the name itself blanked out."""
    with pytest.raises(HTTPException) as refused:
        ui_app._check(access, name)
        raise ui_app._not_found(name)  # what an unknown name the user may look up ends in
    return refused.value.status_code, str(refused.value.detail).replace(repr(name), "<name>")


@pytest.mark.parametrize("without_dag", ["nobody", "configuration", "authenticated"])
def test_a_configured_name_and_an_unknown_one_are_refused_alike(without_dag: str) -> None:
    config = parse_config(config_yaml({name: {} for name in CONFIGURED}))
    access = ui_app.TableAccess(
        "someone", config, Grants({"delta_mirror__orders"}, configuration=True), without_dag
    )
    answers = {name: refusal(access, name) for name in ["payroll", *UNKNOWN]}
    assert len(set(answers.values())) == 1, answers
    status, text = answers["payroll"]
    assert "payroll" not in text and "delta_mirror__" not in text
    assert status == (403 if without_dag == "nobody" else 404)


def test_the_403_text_names_no_table_and_no_dag() -> None:
    assert "delta_mirror__" not in ui_app.FORBIDDEN and "{" not in ui_app.FORBIDDEN
    config = parse_config(config_yaml({name: {} for name in CONFIGURED}))
    access = ui_app.TableAccess("someone", config, Grants(set(), configuration=False), "nobody")
    for name in [*CONFIGURED, *UNKNOWN]:
        with pytest.raises(HTTPException) as refused:
            ui_app._check(access, name)
        assert (refused.value.status_code, refused.value.detail) == (403, ui_app.FORBIDDEN)
