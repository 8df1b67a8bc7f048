"""Error translation, in one place: core error class → Airflow retry semantics.

TRANSIENT → ``AirflowException`` (Airflow retries with the task's backoff);
PERMANENT, CONFLICT, DATA → ``DeltaMirrorFailure`` (an ``AirflowFailException``: no retry), whose
message carries the troubleshooting text.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from delta_mirror.errors import ErrorClass, MirrorError
from delta_mirror.health.troubleshooting import troubleshooting

F = TypeVar("F", bound=Callable[..., Any])


class DeltaMirrorFailure(AirflowFailException):
    """A non-retryable delta-mirror failure (permanent, conflict or data)."""

    def __init__(self, error: MirrorError) -> None:
        self.error = error
        super().__init__(
            f"[{error.error_class.value}] {error.message}\n\n{troubleshooting(error.error_class)}"
        )


class DeltaMirrorTransientError(AirflowException):
    """A transient failure: Airflow retries the task with exponential backoff."""

    def __init__(self, error: MirrorError) -> None:
        self.error = error
        super().__init__(f"[TRANSIENT] {error.message}")


def translate(error: MirrorError) -> AirflowException:
    if error.error_class is ErrorClass.TRANSIENT:
        return DeltaMirrorTransientError(error)
    return DeltaMirrorFailure(error)


def translated(fn: F) -> F:
    """Decorate ``execute`` so core errors become the right Airflow exception."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MirrorError as exc:
            raise translate(exc) from exc

    return wrapper  # type: ignore[return-value]
