"""What every chaos scenario shares: its ``Scale``, the ``Services`` it runs against, the
``ScenarioResult`` it returns, and how a result is judged (``finish`` after the faults, ``safe_now``
during them) with the independent checker of ``chaos_invariants.py`` and ``validate``.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos_harness import CheckpointWatch, ProxyProcess, check_all, recover, validate_all
from chaos_invariants import Verdict
from support.stores import init_store

from delta_mirror.store import SqlStore


@dataclass
class Scale:
    name: str
    s3_versions: int  # versions per table published through the faulty proxy
    s3_fault_rate: float
    kills: int
    pg_restarts: int
    race_versions: int
    foreign_rounds: int
    target_rounds: int
    tables: int = 3


# The two sizes of a run, one row each (a table, so the knobs line up).
SMALL = Scale("small", s3_versions=40, s3_fault_rate=0.25, kills=8, pg_restarts=3,
              race_versions=20, foreign_rounds=1, target_rounds=1, tables=2)  # fmt: skip
LARGE = Scale("large", s3_versions=260, s3_fault_rate=0.3, kills=100, pg_restarts=12,
              race_versions=60, foreign_rounds=4, target_rounds=4, tables=4)  # fmt: skip


@dataclass
class Services:
    workdir: Path
    s3: Any  # services.S3Server
    proxy: ProxyProcess
    pg: Any = None  # services.PgServer (owned: it is restarted)
    seed: int = 0


@dataclass
class ScenarioResult:
    name: str
    faults: int
    fault_kinds: dict[str, int]
    committed: int = 0
    published: int = 0
    lost: int = 0
    duplicated: int = 0
    corrupted: int = 0
    overwritten: int = 0
    recover_seconds: float = 0.0
    recover_cycles: int = 0
    violations: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.violations or self.lost or self.duplicated or self.corrupted or self.overwritten)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class CommitWatch(CheckpointWatch):
    """Also remembers the bytes of each commit file when first seen: a later change is an overwrite."""

    def __init__(self, locations: dict[str, str], s3_client: Any = None) -> None:
        super().__init__(locations, s3_client)
        self.first: dict[tuple[str, str], str] = {}

    def sample(self) -> None:
        super().sample()
        for name, log in self.logs.items():
            try:
                for n in log.names():
                    if n.endswith(".json") and (name, n) not in self.first:
                        data = log.read(n)
                        if data is not None:
                            self.first[(name, n)] = hashlib.sha256(data).hexdigest()
            except Exception:
                continue

    def overwritten(self, skip: set[tuple[str, str]] = frozenset()) -> list[str]:  # type: ignore[assignment]
        out = []
        for (name, n), digest in self.first.items():
            if (name, n) in skip:
                continue
            data = self.logs[name].read(n)
            if data is not None and hashlib.sha256(data).hexdigest() != digest:
                out.append(f"{name}/{n}")
        return out


def new_store(url: str) -> SqlStore:
    return init_store(url)


def finish(
    result: ScenarioResult,
    store_url: str,
    locations: dict[str, str],
    env: dict[str, str],
    svc: Services,
    watch: CommitWatch,
    *,
    proxy_stats: dict[str, Any] | None = None,
    skip: set[tuple[str, str]] = frozenset(),  # type: ignore[assignment]
) -> ScenarioResult:
    """Faults are off: recover, then judge every table with the independent checker and validate."""
    rec = recover(store_url, locations, env, svc.s3.client())
    result.recover_cycles, result.recover_seconds = rec.cycles, rec.seconds
    result.violations += [f"checkpoint watch: {v}" for v in watch.finish()]
    over = watch.overwritten(skip)
    if proxy_stats:
        over += [f"{k} PUT {n} extra time(s)" for k, n in proxy_stats["overwrites"].items()]
    result.overwritten = len(over)
    result.violations += [f"overwritten: {o}" for o in over]
    judge(result, rec.verdicts)
    problems = validate_all(store_url, list(locations), svc.s3.env())
    result.violations += [f"validate {n}: {p}" for n, ps in problems.items() for p in ps]
    return result


def judge(result: ScenarioResult, verdicts: dict[str, Verdict]) -> None:
    for name, v in verdicts.items():
        result.committed += v.committed
        result.published += v.published
        result.lost += len(v.lost)
        result.duplicated += len(v.duplicated)
        result.corrupted += len(v.corrupted)
        result.violations += [f"{name}: {x}" for x in v.violations]
        if not v.recovered:
            result.violations += [f"{name} not recovered: {x}" for x in v.unfinished[:5]]


def safe_now(
    result: ScenarioResult,
    store_url: str,
    locations: dict[str, str],
    env: dict[str, str],
    svc: Services,
    foreign: dict[str, dict[str, bytes]] | None = None,
) -> None:
    """Mid-fault check: nothing broken, status truthful (catching up is allowed)."""
    for name, v in check_all(store_url, locations, env, svc.s3.client(), foreign).items():
        result.violations += [
            f"{name} (during faults): {x}" for x in v.violations + [str(d) for d in v.duplicated]
        ]
        result.violations += [f"{name} (during faults): corrupted {c}" for c in v.corrupted]


__all__ = [
    "LARGE",
    "SMALL",
    "CommitWatch",
    "Scale",
    "ScenarioResult",
    "Services",
    "finish",
    "judge",
    "new_store",
    "safe_now",
]
