"""Error translation in one place: the core's error class decides whether Airflow retries."""

from __future__ import annotations

import pytest

from delta_mirror.errors import (
    CommitConflictError,
    DataError,
    ErrorClass,
    LeaseHeldError,
    MirrorError,
    PermanentError,
    TransientError,
)
from delta_mirror.health.troubleshooting import troubleshooting


@pytest.mark.parametrize(
    "error",
    [
        PermanentError("bucket missing", table="t", hint="create the bucket"),
        CommitConflictError("version 3 was taken", table="t", version=3),
        DataError("invalid add action", table="t", version=2),
    ],
)
def test_permanent_conflict_and_data_errors_fail_the_task_with_what_to_do(error: MirrorError) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from delta_mirror.airflow.errors import DeltaMirrorFailure, translate

    failure = translate(error)
    assert isinstance(failure, DeltaMirrorFailure) and isinstance(failure, AirflowFailException)
    assert failure.error is error
    assert (
        str(failure) == f"[{error.error_class.value}] {error.message}\n\n{troubleshooting(error.error_class)}"
    )


@pytest.mark.parametrize("error", [TransientError("503 SlowDown"), LeaseHeldError("lease held", table="t")])
def test_transient_errors_are_retried_by_airflow(error: MirrorError) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from delta_mirror.airflow.errors import DeltaMirrorTransientError, translate

    retry = translate(error)
    assert isinstance(retry, DeltaMirrorTransientError) and isinstance(retry, AirflowException)
    assert not isinstance(retry, AirflowFailException)
    assert str(retry) == f"[TRANSIENT] {error.message}"


def test_every_error_class_has_troubleshooting_text() -> None:
    for error_class in ErrorClass:
        assert len(troubleshooting(error_class)) > 80


def test_translated_keeps_results_and_lets_other_exceptions_through() -> None:
    from delta_mirror.airflow.errors import DeltaMirrorFailure, translated

    @translated
    def run(value: object) -> object:
        """Doc."""
        if isinstance(value, Exception):
            raise value
        return value

    assert run(42) == 42 and run.__name__ == "run" and run.__doc__ == "Doc."
    with pytest.raises(DeltaMirrorFailure) as exc:
        run(PermanentError("nope"))
    assert isinstance(exc.value.__cause__, PermanentError)
    with pytest.raises(KeyError):  # not a core error: Airflow's default (retry) applies
        run(KeyError("x"))
