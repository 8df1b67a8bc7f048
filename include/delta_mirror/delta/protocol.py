"""Protocol facts the mirror relies on: table features, protocol versions, table-property
durations and their defaults, the checkpoint kinds a protocol allows, and the clock Delta
timestamps are read from.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

MAX_READER_VERSION = 3
MAX_WRITER_VERSION = 7
#: Table features exist only from these versions on; feature lists go with exactly them.
FEATURES_READER_VERSION = 3
FEATURES_WRITER_VERSION = 7

#: Reader features whose semantics survive import and republish unchanged. Anything else may
#: change how the log must be interpreted, so such a table is refused.
KNOWN_READER_FEATURES: frozenset[str] = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "typeWidening",
        "typeWidening-preview",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "variantType",
        "variantType-preview",
        "variantShredding-preview",
        "variantShredding",
        "domainMetadata",
        "icebergCompatV1",
        "icebergCompatV2",
        "rowTracking",
        "inCommitTimestamp",
        "checkConstraints",
        "changeDataFeed",
        "generatedColumns",
        "identityColumns",
        "invariants",
        "appendOnly",
        "allowColumnDefaults",
        "clustering",
        "geospatial",
        "collations-preview",
    }
)

#: Features that hand commit authority to a catalog: plain filesystem readers can no longer read
#: the table, which defeats the purpose of mirroring (docs/how-it-works.md).
CATALOG_FEATURES: frozenset[str] = frozenset({"catalogManaged", "catalogOwned-preview"})
COORDINATED_COMMITS_PREFIX = "delta.coordinatedCommits."

V2_CHECKPOINT_FEATURE = "v2Checkpoint"

# Table properties (``metaData.configuration``) and their protocol defaults.
DELETED_FILE_RETENTION = "delta.deletedFileRetentionDuration"
LOG_RETENTION = "delta.logRetentionDuration"
DEFAULT_TOMBSTONE_RETENTION_MS = 7 * 24 * 3600 * 1000  # interval 1 week
DEFAULT_LOG_RETENTION_MS = 30 * 86_400_000  # interval 30 days

_INTERVAL = re.compile(r"^\s*(?:interval\s+)?(\d+)\s+(\w+?)s?\s*$", re.IGNORECASE)
_UNIT_MS = {
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}


def now_ms() -> int:
    """Now in milliseconds since the epoch, the unit of every Delta timestamp."""
    return int(time.time() * 1000)


def parse_interval_ms(text: str | None, default: int) -> int:
    """Delta's ``interval 1 week`` style durations, in milliseconds (``default`` when unreadable)."""
    if not text:
        return default
    m = _INTERVAL.match(text)
    if not m or m[2].lower() not in _UNIT_MS:
        return default
    return int(m[1]) * _UNIT_MS[m[2].lower()]


def property_duration_ms(configuration: Mapping[str, Any] | None, key: str, default: int) -> int:
    """A duration table property (e.g. :data:`LOG_RETENTION`), or its default."""
    value = (configuration or {}).get(key)
    return parse_interval_ms(value if isinstance(value, str) else None, default)


def reader_features(protocol: Mapping[str, Any]) -> list[str]:
    features = protocol.get("readerFeatures")
    return [str(f) for f in features] if isinstance(features, list) else []


def writer_features(protocol: Mapping[str, Any]) -> list[str]:
    features = protocol.get("writerFeatures")
    return [str(f) for f in features] if isinstance(features, list) else []


def _version_problem(protocol: Mapping[str, Any], side: str, highest: int, with_features: int) -> str | None:
    """What is wrong with ``min{side}Version`` (``side``: Reader or Writer), if anything: not an
    integer, higher than any the protocol defines, or beside a features list without being the
    table-features version."""
    field = f"min{side}Version"
    version = protocol.get(field)
    if not isinstance(version, int) or isinstance(version, bool):
        return f"its protocol has an invalid {field} {version!r}"
    if version > highest:
        return f"it requires {field} {version} (at most {highest} exists)"
    features = f"{side.lower()}Features"
    if protocol.get(features) is not None and version != with_features:
        return f"its protocol lists {features} with {field} {version} (must be {with_features})"
    return None


def unsupported_reasons(protocol: Mapping[str, Any], metadata: Mapping[str, Any] | None) -> list[str]:
    """Why a table with this protocol (and metadata) cannot be carried unchanged under SQL
    authority: catalog-owned commits, unknown reader features, impossible versions. Empty: fine."""
    problems: list[str] = []
    readers, writers = reader_features(protocol), writer_features(protocol)
    catalog = sorted({f for f in [*readers, *writers] if f in CATALOG_FEATURES})
    if catalog:
        problems.append(
            f"it uses the {', '.join(catalog)} table feature (a catalog owns its commits; plain "
            "filesystem readers cannot read it)"
        )
    configuration = (metadata or {}).get("configuration")
    if isinstance(configuration, dict):
        coordinated = sorted(k for k in configuration if str(k).startswith(COORDINATED_COMMITS_PREFIX))
        if coordinated:
            problems.append(f"it uses coordinated commits ({', '.join(coordinated)})")
    unknown = [f for f in readers if f not in KNOWN_READER_FEATURES and f not in CATALOG_FEATURES]
    if unknown:
        problems.append(f"it requires unknown reader feature(s) {', '.join(repr(f) for f in unknown)}")
    if reader_problem := _version_problem(protocol, "Reader", MAX_READER_VERSION, FEATURES_READER_VERSION):
        problems.append(reader_problem)
    writer_version = protocol.get("minWriterVersion")
    if writer_problem := _version_problem(protocol, "Writer", MAX_WRITER_VERSION, FEATURES_WRITER_VERSION):
        problems.append(writer_problem)
    elif protocol.get("minReaderVersion") == 3 and writer_version != FEATURES_WRITER_VERSION:
        problems.append(
            f"its protocol has minReaderVersion 3 with minWriterVersion {writer_version} (must be 7)"
        )
    return problems


class CheckpointKind(StrEnum):
    """The three checkpoint layouts (the values are the stored ``checkpoint_kind`` texts).

    The v2 rule (PROTOCOL.md): a table with the ``v2Checkpoint`` feature gets UUID-named (V2)
    checkpoints and never multi-part ones; a table without it never gets V2 ones.
    """

    CLASSIC = "classic"  # v.checkpoint.parquet
    MULTIPART = "multipart"  # v.checkpoint.o.p.parquet
    V2 = "v2"  # v.checkpoint.<uuid>.(json|parquet), with sidecars

    @staticmethod
    def has_v2_feature(protocol: Mapping[str, Any], *, both: bool = False) -> bool:
        """Whether the protocol names ``v2Checkpoint`` (``both``: as reader *and* writer feature)."""
        in_readers = V2_CHECKPOINT_FEATURE in reader_features(protocol)
        return in_readers and V2_CHECKPOINT_FEATURE in writer_features(protocol) if both else in_readers

    @classmethod
    def for_table(cls, protocol_line: str, preferred: str) -> CheckpointKind:
        """V2 exactly when the protocol has ``v2Checkpoint``; else the table's choice (never V2)."""
        if cls.has_v2_feature(json.loads(protocol_line)["protocol"]):
            return cls.V2
        return cls.CLASSIC if preferred == cls.V2 else cls(preferred)

    def refusal(self, protocol: Mapping[str, Any]) -> tuple[str, str] | None:
        """Why this kind may not be written for ``protocol`` (message, hint), or ``None``."""
        has_v2 = self.has_v2_feature(protocol, both=True)
        if self is CheckpointKind.V2 and not has_v2:
            return (
                "a V2 (UUID-named) checkpoint needs the v2Checkpoint table feature",
                "write a classic checkpoint, or upgrade the protocol to 3/7 with v2Checkpoint first",
            )
        if self is CheckpointKind.MULTIPART and has_v2:
            return (
                "multi-part checkpoints are forbidden on tables with the v2Checkpoint feature",
                "use kind='v2' (sidecars) or 'classic' for this table",
            )
        return None


__all__ = [
    "CATALOG_FEATURES",
    "COORDINATED_COMMITS_PREFIX",
    "DEFAULT_LOG_RETENTION_MS",
    "DEFAULT_TOMBSTONE_RETENTION_MS",
    "DELETED_FILE_RETENTION",
    "FEATURES_READER_VERSION",
    "FEATURES_WRITER_VERSION",
    "KNOWN_READER_FEATURES",
    "LOG_RETENTION",
    "MAX_READER_VERSION",
    "MAX_WRITER_VERSION",
    "V2_CHECKPOINT_FEATURE",
    "CheckpointKind",
    "now_ms",
    "parse_interval_ms",
    "property_duration_ms",
    "reader_features",
    "unsupported_reasons",
    "writer_features",
]
