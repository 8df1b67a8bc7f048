"""The state enums are the stored texts: rows written before they existed read the same."""

from __future__ import annotations

from delta_mirror.store.schema import dl_breakers, dl_tables
from delta_mirror.store.states import Artifact, CircuitState, CommitSource, PublishState, TableState


def test_each_member_is_the_text_stored_in_its_column() -> None:
    assert [str(s) for s in TableState] == ["ACTIVE", "HALTED"]
    assert [str(a) for a in Artifact] == ["json", "checkpoint"]
    assert [str(s) for s in PublishState] == ["PENDING", "IN_PROGRESS", "SUCCESS", "FAILED", "CONFLICT"]
    assert [str(s) for s in CommitSource] == ["native", "spark", "import"]
    assert [str(s) for s in CircuitState] == ["CLOSED", "OPEN", "HALF_OPEN"]
    assert PublishState.SUCCESS == "SUCCESS" and f"{Artifact.JSON}" == "json"


def test_column_defaults_are_members() -> None:
    defaults = {
        TableState.ACTIVE: dl_tables.c.state.server_default,
        CircuitState.CLOSED: dl_breakers.c.state.server_default,
    }
    for member, default in defaults.items():
        assert default is not None and default.arg == member  # type: ignore[attr-defined]
