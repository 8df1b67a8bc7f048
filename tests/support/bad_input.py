"""The generated bad input of ``test_bad_input.py``: invalid commits (each validation rule × its
variants) and hostile table names.

A case is ``(id, commit input, extra CLI arguments, error class, what the refusal must say)``; paths
under ``file:///ROOT/tables`` are replaced by the test's real table roots.
"""

from __future__ import annotations

from typing import Any

from delta_mirror.errors import ErrorClass
from support.builders import action, add_body, cdc_body, lines, metadata_body, protocol_body, remove_body

PROTOCOL: dict[str, Any] = protocol_body()
METADATA: dict[str, Any] = metadata_body()


def jl(*actions: tuple[str, Any]) -> bytes:
    """``(kind, body)`` pairs as commit input."""
    return lines(*(action(kind, body) for kind, body in actions))


def without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


Case = tuple[str, bytes, list[str], ErrorClass, tuple[str, ...]]


def _paths(table_root: str, other_root: str) -> list[tuple[str, str]]:
    """(hostile data-file path, what the refusal says)."""
    return [
        ("../x.parquet", "escapes the table root"),
        ("a/../../x.parquet", "escapes the table root"),
        ("./../x.parquet", "escapes the table root"),
        ("..", "escapes the table root"),
        ("%2e%2e/x.parquet", "escapes the table root"),
        ("%2E%2E/x.parquet", "escapes the table root"),
        ("a/%2e%2e/%2e%2e/x.parquet", "escapes the table root"),
        ("..%2fx.parquet", "escapes the table root"),
        ("/etc/passwd", "relative to the table root"),
        ("%2Fetc%2Fpasswd", "relative to the table root"),
        ("a\\..\\..\\x.parquet", "relative to the table root"),
        ("x\x00.parquet", "relative to the table root"),
        ("x%00.parquet", "relative to the table root"),
        ("s3://other-bucket/x.parquet", "outside the table root"),
        ("file:///etc/passwd", "outside the table root"),
        (f"{other_root}/x.parquet", "outside the table root"),
        (f"{table_root}/../x.parquet", "escapes the table root"),
        ("_delta_log/00000000000000000009.json", "points into _delta_log/"),
        ("_delta_log%2F00000000000000000009.json", "points into _delta_log/"),
        ("", "empty path"),
    ]


class _Cases(list[Case]):
    def data(self, cid: str, body: bytes, needles: tuple[str, ...], extra: list[str] | None = None) -> None:
        """A commit refused as bad data (exit 4), saying each of ``needles``."""
        self.append((cid, body, extra or [], ErrorClass.DATA, needles))


def generate(table_root: str, other_root: str) -> list[Case]:
    """Each validation rule × its variants; version 2 is the next version of table 't'."""
    return [
        *_path_cases(table_root, other_root),
        *_required_field_cases(),
        *_wrong_type_cases(),
        *_metadata_cases(),
        *_protocol_cases(),
        *_commit_rule_cases(),
        *_raw_byte_cases(),
    ]


def _path_cases(table_root: str, other_root: str) -> list[Case]:
    """Paths that leave the table root, in every action that names a data file."""
    cases = _Cases()
    for i, (path, says) in enumerate(_paths(table_root, other_root)):
        cases.data(f"path{i}-add", jl(("add", add_body(path))), ("version 2", says))
        cases.data(f"path{i}-remove", jl(("remove", remove_body(path))), ("version 2", says))
        cases.data(f"path{i}-cdc", jl(("cdc", cdc_body(path))), ("version 2", says))
        cases.data(
            f"path{i}-after-valid",
            jl(("add", add_body("ok.parquet")), ("add", add_body(path))),
            ("action 2", says),
        )
    return cases


def _required_field_cases() -> list[Case]:
    """Required fields, one missing at a time."""
    cases = _Cases()
    required = {
        "add": (add_body(), ("path", "size", "partitionValues", "modificationTime", "dataChange")),
        "remove": (remove_body("a.parquet"), ("path", "dataChange")),
        "cdc": (cdc_body("c.parquet"), ("path", "size", "partitionValues", "dataChange")),
        "metaData": (METADATA, ("id", "format", "schemaString", "partitionColumns")),
        "protocol": (PROTOCOL, ("minReaderVersion", "minWriterVersion")),
        "txn": ({"appId": "app", "version": 1}, ("appId", "version")),
        "domainMetadata": (
            {"domain": "d", "configuration": "{}", "removed": False},
            ("domain", "configuration", "removed"),
        ),
    }
    for kind, (body, fields) in required.items():
        for f in fields:
            cases.data(
                f"missing-{kind}-{f}",
                jl((kind, without(body, f))),
                ("version 2", f"missing required field '{f}'"),
            )
            cases.data(f"null-{kind}-{f}", jl((kind, {**body, f: None})), ("version 2", f"'{f}'"))
    return cases


def _wrong_type_cases() -> list[Case]:
    """Wrong types and values."""
    cases = _Cases()
    wrong: list[tuple[str, str, dict[str, Any], str]] = [
        ("add-size-string", "add", {**add_body(), "size": "1"}, "'size' must be int"),
        ("add-size-float", "add", {**add_body(), "size": 1.5}, "'size' must be int"),
        ("add-size-bool", "add", {**add_body(), "size": True}, "must be an integer"),
        ("add-size-negative", "add", add_body(size=-1), "must not be negative"),
        ("add-size-huge-negative", "add", add_body(size=-(2**63)), "must not be negative"),
        ("add-mtime-string", "add", add_body(modificationTime="now"), "'modificationTime' must be int"),
        ("add-datachange-string", "add", add_body(dataChange="true"), "'dataChange' must be bool"),
        ("add-stats-object", "add", add_body(stats={"numRecords": 1}), "'stats' must be str"),
        ("add-pv-list", "add", add_body(partitionValues=["a"]), "'partitionValues' must be dict"),
        ("add-pv-int", "add", add_body(partitionValues={"p": 1}), "must map strings to strings"),
        ("add-path-int", "add", {**add_body(), "path": 7}, "'path' must be str"),
        ("add-dv-string", "add", add_body(deletionVector="dv"), "deletionVector must be an object"),
        ("add-dv-incomplete", "add", add_body(deletionVector={"storageType": "u"}), "missing required field"),
        ("remove-size-negative", "remove", {**remove_body("a.parquet"), "size": -5}, "must not be negative"),
        ("cdc-size-negative", "cdc", {**cdc_body("c.parquet"), "size": -5}, "must not be negative"),
        ("txn-version-string", "txn", {"appId": "a", "version": "1"}, "'version' must be int"),
        (
            "dm-config-object",
            "domainMetadata",
            {"domain": "d", "configuration": {}, "removed": False},
            "must be str",
        ),
        ("commitinfo-ts-string", "commitInfo", {"timestamp": "yesterday"}, "'timestamp' must be int"),
        ("commitinfo-ict-float", "commitInfo", {"inCommitTimestamp": 1.5}, "'inCommitTimestamp' must be int"),
        ("unknown-action", "fooBar", {"a": 1}, "unknown action type 'fooBar'"),
        ("checkpoint-only-action", "sidecar", {"path": "x"}, "unknown action type 'sidecar'"),
    ]
    for cid, kind, body, says in wrong:
        cases.data(cid, jl((kind, body)), ("version 2", says))
    return cases


def _metadata_cases() -> list[Case]:
    """MetaData."""
    cases = _Cases()
    bad_schemas = ["not json", "[1,2]", '{"type":"array"}', '{"fields":[]}', "42", "null", '"struct"']
    for i, schema in enumerate(bad_schemas):
        cases.data(
            f"schema{i}",
            jl(("metaData", {**METADATA, "schemaString": schema})),
            ("version 2", "schemaString"),
        )
    for cid, body, says in [
        (
            "partition-columns-string",
            {**METADATA, "partitionColumns": "id"},
            "'partitionColumns' must be list",
        ),
        ("partition-columns-ints", {**METADATA, "partitionColumns": [1]}, "partitionColumns must be strings"),
        ("configuration-int", {**METADATA, "configuration": {"a": 1}}, "must map strings to strings"),
        ("format-no-provider", {**METADATA, "format": {}}, "missing required field 'provider'"),
        (
            "coordinated-commits",
            {**METADATA, "configuration": {"delta.coordinatedCommits.commitCoordinator-preview": "x"}},
            "is not allowed",
        ),
    ]:
        cases.data(cid, jl(("metaData", body)), ("version 2", says))
    return cases


def _protocol_cases() -> list[Case]:
    """Protocol: features, versions, downgrades."""
    cases = _Cases()

    for cid, body, says in [
        (
            "unknown-reader-feature",
            protocol_body(3, 7, ["blahabl"], ["blahabl"]),
            "unknown reader feature(s) 'blahabl'",
        ),
        (
            "reader-feature-wrong-case",
            protocol_body(3, 7, ["DeletionVectors"], ["DeletionVectors"]),
            "unknown reader",
        ),
        ("reader-feature-empty-name", protocol_body(3, 7, [""], [""]), "unknown reader"),
        (
            "reader-feature-not-in-writer",
            protocol_body(3, 7, ["deletionVectors"], []),
            "missing from writerFeatures",
        ),
        (
            "catalog-managed",
            protocol_body(3, 7, ["catalogManaged"], ["catalogManaged"]),
            "'catalogManaged' is not allowed",
        ),
        (
            "catalog-owned",
            protocol_body(3, 7, [], ["catalogOwned-preview"]),
            "'catalogOwned-preview' is not allowed",
        ),
        ("reader-version-4", protocol_body(4, 7, None, []), "does not exist"),
        ("writer-version-8", protocol_body(1, 8), "does not exist"),
        ("reader-version-0", protocol_body(0, 2), "must be positive"),
        ("writer-version-negative", protocol_body(1, -1), "must be positive"),
        (
            "reader-features-on-2",
            protocol_body(2, 7, [], []),
            "readerFeatures is only allowed with minReaderVersion 3",
        ),
        ("writer-features-on-5", protocol_body(1, 5, None, ["appendOnly"]), "writerFeatures is only allowed"),
        ("reader-3-writer-5", protocol_body(3, 5, []), "minReaderVersion 3 needs minWriterVersion 7"),
        (
            "features-not-list",
            protocol_body(3, 7, "deletionVectors", []),
            "must be a list of strings",
        ),  # a str, not a list
        ("writer-downgrade", protocol_body(1, 1), "protocol downgrade: minWriterVersion 2 -> 1"),
    ]:
        cases.data(cid, jl(("protocol", body)), ("version 2", says))
    return cases


def _commit_rule_cases() -> list[Case]:
    """Commit-level rules."""
    cases = _Cases()
    cases.data("duplicate-add", jl(("add", add_body()), ("add", add_body())), ("version 2", "duplicate add"))
    cases.data(
        "duplicate-remove",
        jl(("remove", remove_body("a.parquet")), ("remove", remove_body("a.parquet"))),
        ("version 2", "duplicate remove"),
    )
    cases.data("two-metadata", jl(("metaData", METADATA), ("metaData", METADATA)), ("2 'metaData' actions",))
    cases.data("two-protocol", jl(("protocol", PROTOCOL), ("protocol", PROTOCOL)), ("2 'protocol' actions",))
    cases.data("two-commitinfo", jl(("commitInfo", {}), ("commitInfo", {})), ("2 'commitInfo' actions",))
    cases.data("remove-unknown-file", jl(("remove", remove_body("ghost.parquet"))), ("not an active file",))
    cases.data(
        "remove-twice-removed",
        jl(("remove", remove_body("a.parquet")), ("remove", remove_body("gone.parquet"))),
        ("gone",),
    )
    for v in (3, 100, 2**62):
        cases.data(
            f"version-gap-{v}",
            jl(("add", add_body())),
            (f"version {v}", "version gap"),
            ["--expected-version", str(v)],
        )
    for v in (0, 1):
        cases.append(
            (f"version-taken-{v}", jl(("add", add_body())), ["--expected-version", str(v)], ErrorClass.CONFLICT,
             (f"version {v}", "already committed"))
        )  # fmt: skip
    return cases


def _raw_byte_cases() -> list[Case]:
    """Bytes that are not JSON lines of actions."""
    cases = _Cases()
    for cid, raw, says in [
        ("non-utf8-latin1", b'{"add": {"path": "caf\xe9.parquet"}}\n', "not valid UTF-8"),
        ("non-utf8-ff", b"\xff\xfe{}\n", "not valid UTF-8"),
        ("non-utf8-truncated", b'{"add": {"path": "\xe2\x82"}}\n', "not valid UTF-8"),
        ("non-utf8-overlong-slash", b'{"add": {"path": "a\xc0\xafb"}}\n', "not valid UTF-8"),
        ("utf16", '{"add": {}}\n'.encode("utf-16"), "not valid UTF-8"),
        ("lone-surrogate", b'{"add": {"path": "x\\ud800.parquet"}}\n', "lone UTF-16 surrogate"),
        ("raw-nul", b'{"add": {"path": "x\x00.parquet"}}\n', "malformed JSON"),
        ("deep-nesting", b'{"add": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "nested too deeply"),
        ("trailing-comma", b'{"add": {"path": "x",}}\n', "malformed JSON"),
        ("single-quotes", b"{'add': {}}\n", "malformed JSON"),
        ("unterminated", b'{"add": {"path": "x\n', "malformed JSON"),
        ("nan", b'{"add": {"size": NaN}}\n', "malformed JSON"),
        ("infinity", b'{"add": {"size": Infinity}}\n', "malformed JSON"),
        ("neg-infinity", b'{"add": {"size": -Infinity}}\n', "malformed JSON"),
        ("bare-number", b"42\n", "exactly one key"),
        ("bare-string", b'"add"\n', "exactly one key"),
        ("array", b"[{}]\n", "exactly one key"),
        ("empty-object", b"{}\n", "exactly one key"),
        ("two-keys", b'{"add": {}, "remove": {}}\n', "exactly one key"),
        ("body-list", b'{"add": []}\n', "must be a JSON object"),
        ("body-null", b'{"add": null}\n', "must be a JSON object"),
        ("body-string", b'{"add": "x"}\n', "must be a JSON object"),
        ("empty-input", b"", "no actions"),
        ("blank-lines", b"\n\n  \n", "no actions"),
        ("crlf-garbage", b"\r\n\x1a\r\n", "malformed JSON"),
        ("second-line-bad", jl(("add", add_body())) + b"{nope}\n", "line 2: malformed JSON"),
    ]:
        cases.data(cid, raw, (says,))
    return cases


HOSTILE_NAMES = [
    "x'; DROP TABLE dl_tables;--",
    "t; DELETE FROM dl_commits",
    "t' OR '1'='1",
    't" OR "1"="1',
    "Robert'); DROP TABLE dl_actions;--",
    "t;--",
    "t/*",
    "*",
    "%",
    "t%_",
    "a b",
    'a"b',
    "t\\",
    "t\n",
    "t\r\nDROP",
    "t\x00",
    "t\u200b",
    "ｔ",
    "таблица",
    "表",
    "../t",
    "t/../other",
    "t/x",
    ".hidden",
    "-dash",
    "",
    " ",
    "a" * 129,
    "a" * 10_000,
    "t;",
]
