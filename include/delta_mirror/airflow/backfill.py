"""Validation of the backfill form beyond what the ``Param`` JSON schema can say."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException


def check_backfill_params(params: dict[str, Any], tables: Sequence[str]) -> dict[str, Any]:
    """Reject a bad table, a negative version or from > to with one clear message (no retry)."""
    table = params.get("table")
    if table not in tables:
        raise AirflowFailException(
            f"invalid backfill input: table {table!r} is not configured "
            f"(choose one of: {', '.join(tables) or 'none'})"
        )
    lo, hi = params.get("from_version"), params.get("to_version")
    for name, value in (("from_version", lo), ("to_version", hi)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise AirflowFailException(
                f"invalid backfill input: {name} must be a non-negative integer, got {value!r}"
            )
    if lo is not None and hi is not None and lo > hi:
        raise AirflowFailException(
            f"invalid backfill input: from_version {lo} is after to_version {hi} "
            f"for table {table!r}; swap them"
        )
    steps = params.get("steps") or []
    unknown = [s for s in steps if s not in ("publish", "checkpoint", "validate")]
    if not steps or unknown:
        raise AirflowFailException(
            f"invalid backfill input: steps must be a non-empty subset of "
            f"publish, checkpoint, validate (got {steps!r})"
        )
    return {"table": table, "from_version": lo, "to_version": hi, "steps": list(steps)}
