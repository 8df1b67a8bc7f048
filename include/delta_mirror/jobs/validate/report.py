"""What validation reports: mirror problems and reader limitations, each with the version, what was
found and what to do.

A **problem** is the mirror's business: the published log (or a file it names) disagrees with the
store. A **limitation** is the reader's: the log is right and every file it names is in storage,
but this reader does not implement a feature the table uses, or has a known defect reading it.
Limitations do not fail validation unless it is strict; each names a reader to use instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

MAX_PROBLEMS_PER_KIND = 20  # a systematic fault shows on every version; the first few say it all
NOT_LISTED = "... and {n} more {what} not listed"


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
    # per kind (problems) or reader (limitations): how many were found, and the entry saying how
    # many are not listed (kept up to date in place)
    _found: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    _notes: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def add_problem(self, problem: Problem) -> None:
        """List the first ``MAX_PROBLEMS_PER_KIND`` of a kind; then one entry counts the rest."""
        kind = problem.kind

        def note(n: int, version: int | None) -> Problem:
            what = f"{kind} problem{'s' if n > 1 else ''}"
            return Problem(
                kind, version, NOT_LISTED.format(n=n, what=what), "fix the problems above and validate again"
            )

        self._add(self.problems, f"problem:{kind}", problem, note)

    def add_limitation(self, limitation: Limitation) -> None:
        """As :meth:`add_problem`, per reader."""
        reader, use = limitation.reader, limitation.use_instead

        def note(n: int, version: int | None) -> Limitation:
            what = f"limitation{'s' if n > 1 else ''} of {reader}"
            return Limitation(reader, version, NOT_LISTED.format(n=n, what=what), use)

        self._add(self.limitations, f"limitation:{reader}", limitation, note)

    def _add(
        self, entries: list[Any], key: str, entry: Any, note_of: Callable[[int, int | None], Any]
    ) -> None:
        """Append ``entry`` while under the cap; past it, put the note counting the rest in place of
        the previous note (``note_of(how many not listed, the first of them)``)."""
        n = self._found[key] = self._found.get(key, 0) + 1
        if n <= MAX_PROBLEMS_PER_KIND:
            entries.append(entry)
            return
        old = self._notes.get(key)
        note = self._notes[key] = note_of(
            n - MAX_PROBLEMS_PER_KIND, entry.version if old is None else old.version
        )
        for i in range(len(entries) - 1, -1, -1):
            if entries[i] is old:
                entries[i] = note
                return
        entries.append(note)

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


class ReaderFacts(Protocol):
    """What a report needs of a reader: its name, and the reader to use when it cannot read."""

    @property
    def name(self) -> str: ...

    @property
    def use_instead(self) -> str: ...


@dataclass(frozen=True)
class ReaderReport:
    """One reader's way into the report: its problems and limitations, capped by the report."""

    reader: ReaderFacts
    report: ValidationReport

    def problem(self, kind: str, version: int | None, message: str, hint: str) -> None:
        self.report.add_problem(Problem(kind, version, message, hint))

    def limitation(self, version: int | None, message: str) -> None:
        """This reader cannot read ``version`` although the table is right."""
        self.add(Limitation(self.reader.name, version, message, self.reader.use_instead))

    def add(self, found: Problem | Limitation) -> None:
        if isinstance(found, Problem):
            self.report.add_problem(found)
        else:
            self.report.add_limitation(found)


def version_runs(versions: list[int]) -> list[tuple[int, int]]:
    """Ascending versions as (first, last) runs of consecutive numbers (for messages like 3..7)."""
    out: list[tuple[int, int]] = []
    for v in versions:
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


__all__ = [
    "MAX_PROBLEMS_PER_KIND",
    "Limitation",
    "Problem",
    "ReaderFacts",
    "ReaderReport",
    "ValidationReport",
    "version_runs",
]
