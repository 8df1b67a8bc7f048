"""What validation reports: problems, each with the version, what was found and what to do."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

READERS = ("deltalake", "spark")
MAX_PROBLEMS_PER_KIND = 20  # a systematic fault shows on every version; the first few say it all


@dataclass(frozen=True)
class Problem:
    """One disagreement between the published log and the store."""

    kind: str
    version: int | None
    message: str  # what was expected and what was found
    hint: str  # the likely cause and what to do


@dataclass
class ValidationReport:
    table: str
    location: str
    from_version: int | None
    to_version: int | None
    versions_checked: int
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "location": self.location,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "versions_checked": self.versions_checked,
            "ok": self.ok,
            "problems": [asdict(p) for p in self.problems],
        }


__all__ = ["MAX_PROBLEMS_PER_KIND", "READERS", "Problem", "ValidationReport"]
