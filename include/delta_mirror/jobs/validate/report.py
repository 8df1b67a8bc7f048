"""What validation reports: mirror problems and reader limitations, each with the version, what was
found and what to do.

A **problem** is the mirror's business: the published log (or a file it names) disagrees with the
store. A **limitation** is the reader's: the log is right and every file it names is in storage,
but this reader does not implement a feature the table uses, or has a known defect reading it.
Limitations do not fail validation unless it is strict; each names a reader to use instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

READERS = ("deltalake", "spark", "duckdb", "kernel-java", "auto")
MAX_PROBLEMS_PER_KIND = 20  # a systematic fault shows on every version; the first few say it all


@dataclass(frozen=True)
class Problem:
    """One disagreement between the published log and the store."""

    kind: str
    version: int | None
    message: str  # what was expected and what was found
    hint: str  # the likely cause and what to do


@dataclass(frozen=True)
class Limitation:
    """A version this reader cannot read although the published table is right."""

    reader: str
    version: int | None
    message: str  # what the reader cannot do, and the evidence that the table is right
    use_instead: str  # a reader that reads it


@dataclass
class ValidationReport:
    table: str
    location: str
    from_version: int | None
    to_version: int | None
    versions_checked: int
    problems: list[Problem] = field(default_factory=list)
    limitations: list[Limitation] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # versions another reader read (--reader auto)

    @property
    def ok(self) -> bool:
        """No mirror problem (reader limitations do not count; see :meth:`passed`)."""
        return not self.problems

    def passed(self, *, strict: bool = False) -> bool:
        """The verdict: no problem, and with ``strict`` no limitation either."""
        return self.ok and not (strict and self.limitations)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "location": self.location,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "versions_checked": self.versions_checked,
            "ok": self.ok,
            "problems": [asdict(p) for p in self.problems],
            "limitations": [asdict(lim) for lim in self.limitations],
            "fallbacks": list(self.fallbacks),
        }


def version_runs(versions: list[int]) -> list[tuple[int, int]]:
    """Ascending versions as (first, last) runs of consecutive numbers (for messages like 3..7)."""
    out: list[tuple[int, int]] = []
    for v in versions:
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


__all__ = ["MAX_PROBLEMS_PER_KIND", "READERS", "Limitation", "Problem", "ValidationReport", "version_runs"]
