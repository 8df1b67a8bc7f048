"""Specification of the ``_last_checkpoint`` pointer (``delta/last_checkpoint.py``), case by case.

From PROTOCOL.md: the pointer is a hint to a recent checkpoint (``version`` and ``size``
required; ``parts`` for a multi-part checkpoint, ``sizeInBytes``, ``numOfAddFiles``, and
``v2Checkpoint`` for a UUID-named one optional); readers that cannot use it list the log instead.
The mirror's own rules on top: it writes ``parts`` only above 1 and no nulls (Trino rejects
both), and a pointer it publishes names a complete checkpoint, follows its commit and never moves
backwards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.delta_log import lay_out, multipart, parquet_rows, uuid_checkpoint, v

from delta_mirror.delta.last_checkpoint import (
    LastCheckpoint,
    LastCheckpointError,
    judge_last_checkpoint,
    pointer_for_files,
)
from delta_mirror.delta.protocol import CheckpointKind

V2_POINTER = {"path": uuid_checkpoint(4), "sizeInBytes": 10, "modificationTime": 0}

# -- reading ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "version", "kind", "num_parts", "v2_name"),
    [
        (b'{"version":10,"size":5}', 10, CheckpointKind.CLASSIC, None, None),
        (b'{"version":10,"size":5,"parts":3}', 10, CheckpointKind.MULTIPART, 3, None),
        (b'{"version":10,"size":5,"parts":1}', 10, CheckpointKind.CLASSIC, None, None),  # 1 part: one file
        (json.dumps({"version": 4, "size": 1, "v2Checkpoint": V2_POINTER}).encode(), 4, CheckpointKind.V2, None, uuid_checkpoint(4)),
        (
            json.dumps({"version": 4, "size": 1, "v2Checkpoint": {"path": f"s3://b/t/_delta_log/{v(4, 'checkpoint.a%2Bb.json')}"}}).encode(),
            4, CheckpointKind.V2, None, v(4, "checkpoint.a+b.json"),
        ),  # a URL: its last segment, decoded
        (b'{"version":0,"size":1,"checksum":"x","checkpointSchema":{}}', 0, CheckpointKind.CLASSIC, None, None),
        (b' {"version": 7, "size": 1} \n', 7, CheckpointKind.CLASSIC, None, None),  # blanks are JSON's
    ],
    ids=["classic", "multipart", "parts-1", "v2", "v2-by-url", "unknown-keys-kept", "blanks"],
)  # fmt: skip
def test_a_pointer_names_the_version_and_kind_of_its_checkpoint(
    data: bytes, version: int, kind: CheckpointKind, num_parts: int | None, v2_name: str | None
) -> None:
    pointer = LastCheckpoint.parse(data)
    assert (pointer.version, pointer.kind, pointer.num_parts, pointer.v2_name) == (
        version,
        kind,
        num_parts,
        v2_name,
    )
    assert pointer.fields == json.loads(data)
    assert LastCheckpoint.read(data) == pointer


@pytest.mark.parametrize(
    ("data", "refused"),
    [
        (b"", r"is not valid JSON"),
        (b'{"version":10,"si', r"is not valid JSON"),  # truncated
        (b'{"version":NaN,"size":1}', r"is not valid JSON \(NaN is not valid JSON\)"),
        (b"\xff\xfe{}", r"is not valid JSON"),  # not UTF-8
        (b"[10]", r"must be a JSON object, found list"),
        (b"10", r"must be a JSON object, found int"),
        (b'{"size":1}', r"has no valid 'version' \(found None\)"),
        (b'{"version":-1,"size":1}', r"has no valid 'version' \(found -1\)"),
        (b'{"version":"4","size":1}', r"has no valid 'version' \(found '4'\)"),
        (b'{"version":true,"size":1}', r"has no valid 'version' \(found True\)"),
        (b'{"version":4.0,"size":1}', r"has no valid 'version' \(found 4.0\)"),
    ],
)
def test_a_pointer_without_a_usable_version_is_refused_and_read_as_absent(data: bytes, refused: str) -> None:
    with pytest.raises(LastCheckpointError, match=refused):
        LastCheckpoint.parse(data)
    assert LastCheckpoint.read(data) is None  # a reader lists the log instead
    assert LastCheckpoint.read(None) is None


@pytest.mark.parametrize(
    ("fields", "defects"),
    [
        ({"version": 4, "size": 7, "sizeInBytes": 100, "numOfAddFiles": 3}, []),
        ({"version": 4, "size": 7, "parts": 3}, []),
        ({"version": 4}, ["has no valid 'size' (found None)"]),
        ({"version": 4, "size": "7"}, ["has no valid 'size' (found '7')"]),
        ({"version": 4, "size": 7, "sizeInBytes": None}, ["has null fields ['sizeInBytes']"]),
        ({"version": 4, "size": 7, "parts": 1}, ['contains "parts":1 for a single-file checkpoint']),
        ({"version": 4, "size": 7, "parts": 0}, ["has an invalid 'parts' value 0"]),
        ({"version": 4, "size": 7, "parts": "2"}, ["has an invalid 'parts' value '2'"]),
        (
            {"version": 4, "size": None, "parts": None},
            ["has no valid 'size' (found None)", "has null fields ['parts', 'size']"],
        ),
    ],
)
def test_what_is_wrong_with_a_pointers_fields_is_listed(fields: dict[str, Any], defects: list[str]) -> None:
    pointer = LastCheckpoint.parse(json.dumps(fields).encode())
    assert [message for message, _cause in pointer.defects()] == defects


# -- writing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pointer", "rendered"),
    [
        (
            LastCheckpoint(4, size=7, size_in_bytes=100, num_of_add_files=3),
            b'{"version":4,"size":7,"sizeInBytes":100,"numOfAddFiles":3}\n',
        ),
        (
            LastCheckpoint(4, size=7, parts=3, size_in_bytes=100, num_of_add_files=3),
            b'{"version":4,"size":7,"parts":3,"sizeInBytes":100,"numOfAddFiles":3}\n',
        ),
        (
            LastCheckpoint(4, size=7, parts=1, size_in_bytes=100, num_of_add_files=3),
            b'{"version":4,"size":7,"sizeInBytes":100,"numOfAddFiles":3}\n',
        ),  # no "parts":1 (Trino rejects it)
        (
            LastCheckpoint(4, size=2, size_in_bytes=9, num_of_add_files=1, v2_checkpoint={"path": "p"}),
            b'{"version":4,"size":2,"sizeInBytes":9,"numOfAddFiles":1,"v2Checkpoint":{"path":"p"}}\n',
        ),
    ],
    ids=["classic", "multipart", "parts-1-left-out", "v2"],
)
def test_a_pointer_is_written_in_sparks_key_order_and_reads_back_the_same(
    pointer: LastCheckpoint, rendered: bytes
) -> None:
    assert pointer.render() == rendered
    again = LastCheckpoint.parse(rendered)
    assert (again.version, again.size, again.num_parts, again.v2_name) == (
        pointer.version,
        pointer.size,
        pointer.num_parts,
        pointer.v2_name,
    )


def test_a_pointer_made_true_of_another_writers_checkpoint_counts_that_files_rows() -> None:
    """Spark checkpointed the same version first and its file was kept: size, numOfAddFiles and
    sizeInBytes describe that file (3 rows, 2 of them adds), not the mirror's."""
    ours = b"the mirror's bytes"
    theirs = parquet_rows("add", [{"path": "a"}, {"path": "b"}, None])
    built = LastCheckpoint(4, size=9, size_in_bytes=len(ours), num_of_add_files=9).render()
    kept = LastCheckpoint.parse(pointer_for_files(built, [(v(4, "checkpoint.parquet"), ours, theirs)]))
    assert (kept.version, kept.size, kept.num_of_add_files, kept.size_in_bytes) == (4, 3, 2, len(theirs))
    # the mirror's own file kept (or a V2 one, named by the mirror's id): the pointer as built
    assert pointer_for_files(built, [(v(4, "checkpoint.parquet"), ours, ours)]) == built
    v2 = LastCheckpoint(4, size=9, size_in_bytes=1, num_of_add_files=9, v2_checkpoint=V2_POINTER).render()
    assert pointer_for_files(v2, [(uuid_checkpoint(4), ours, theirs)]) == v2


# -- judging it against the log -----------------------------------------------------------------------

CLASSIC_AT_4 = [v(3), v(4), v(4, "checkpoint.parquet")]


@pytest.mark.parametrize(
    ("files", "pointer", "published", "newest", "problems"),
    [
        (CLASSIC_AT_4, None, None, None, []),  # optional: absent is fine
        (CLASSIC_AT_4, {"version": 4, "size": 1}, 4, 4, []),
        (
            [v(4)],
            {"version": 4, "size": 1},
            None,
            None,
            [(4, "points at a checkpoint at version 4, but the log holds nothing there")],
        ),
        (
            [multipart(4, 1, 3), multipart(4, 2, 3)],
            {"version": 4, "size": 1, "parts": 3},
            None,
            None,
            [(4, f"points at a 3-part checkpoint at version 4, but the log holds {multipart(4, 1, 3)}, {multipart(4, 2, 3)} there")],
        ),  # a missing part
        (
            CLASSIC_AT_4,
            {"version": 4, "size": 1, "v2Checkpoint": V2_POINTER},
            None,
            None,
            [(4, f"points at checkpoint {uuid_checkpoint(4)} at version 4, but the log holds {v(4, 'checkpoint.parquet')} there")],
        ),  # not the V2 file it names
        (
            CLASSIC_AT_4,
            {"version": 4, "size": 1},
            3,
            None,
            [(4, "points at version 4, after the last published version 3")],
        ),  # a checkpoint must follow its commit
        (
            CLASSIC_AT_4,
            {"version": 4, "size": 1},
            None,
            6,
            [(4, "points at version 4, older than the store's newest checkpoint 6")],
        ),  # moved backwards
        (
            CLASSIC_AT_4,
            {"version": 4, "size": 1, "parts": 1},
            None,
            None,
            [(4, 'contains "parts":1 for a single-file checkpoint')],
        ),
    ],
    ids=["absent", "good", "no-checkpoint", "missing-part", "other-v2-file", "ahead", "backwards", "parts-1"],
)  # fmt: skip
def test_a_pointer_is_judged_against_the_listed_log_and_the_stores_record(
    tmp_path: Path,
    files: list[str],
    pointer: dict[str, Any] | None,
    published: int | None,
    newest: int | None,
    problems: list[tuple[int, str]],
) -> None:
    listing, refs = lay_out(tmp_path, files)
    data = None if pointer is None else json.dumps(pointer).encode()
    found = judge_last_checkpoint(data, listing, refs, last_published=published, newest_checkpoint=newest)
    assert [(p.version, p.message) for p in found] == problems
    assert all(p.cause for p in found if "parts" in p.message or "points at" in p.message)  # each says why


def test_an_unreadable_pointer_is_one_problem_with_no_version(tmp_path: Path) -> None:
    listing, refs = lay_out(tmp_path, CLASSIC_AT_4)
    (problem,) = judge_last_checkpoint(b'{"version":', listing, refs)
    assert problem.version is None and problem.message.startswith("is not valid JSON")
    assert problem.cause == "it was truncated or written by hand; "
