"""Specification of the one listing of ``_delta_log/`` (``delta/log_listing.py``), case by case.

From PROTOCOL.md: commits are ``<v>.json``; a checkpoint is classic (``<v>.checkpoint.parquet``),
multi-part (``<v>.checkpoint.<o>.<p>.parquet``, part ``o`` of ``p``) or UUID-named V2
(``<v>.checkpoint.<uuid>.json|parquet``) with sidecars in ``_delta_log/_sidecars/``; readers
must ignore a multi-part checkpoint with a missing part, and a V2 checkpoint is only complete
with every sidecar it references; several checkpoints may exist for one version and a client
may choose. Anything else in the folder is not part of the log.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.delta_log import UUID, lay_out, multipart, parquet_rows, sidecar_lines, uuid_checkpoint, v

from delta_mirror.delta.log_listing import LogListing
from delta_mirror.delta.protocol import CheckpointKind

CLASSIC, MULTIPART, V2 = CheckpointKind.CLASSIC, CheckpointKind.MULTIPART, CheckpointKind.V2


def checkpoints(listing: LogListing) -> dict[int, list[tuple[CheckpointKind, list[str], bool]]]:
    """Per version, in the listing's order of preference: (kind, names, every part listed)."""
    return {
        version: [(cp.kind, cp.names, cp.parts_complete) for cp in found]
        for version, found in listing.checkpoints.items()
    }


# -- what a listing holds ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "commits", "strays"),
    [
        ([v(0), v(1), v(2)], [0, 1, 2], []),
        ([v(5), v(7)], [5, 7], []),  # a gap is listed as it is: judging it is not the listing's job
        ([v(0), v(1, "crc"), v(0, f"{1:020d}.compacted.json")], [0], []),  # protocol files, not commits
        ([v(0), "_last_checkpoint"], [0], []),
        (
            [v(0), v(1, "json.tmp"), f".{v(1)}.crc", "README", "0.json", v(1, "checkpoint.parquet.part")],
            [0],
            [f".{v(1)}.crc", "0.json", v(1, "checkpoint.parquet.part"), v(1, "json.tmp"), "README"],
        ),  # Hadoop's hidden .crc, temp files, unpadded names: strays, in path order
        ([v(0), f"_commits/{v(1)}", f"_staged_commits/{v(2, UUID + '.json')}", "_autostats/x"], [0], []),
    ],
    ids=["contiguous", "gap", "crc-and-compaction", "last-checkpoint", "strays", "sub-folders-left-out"],
)
def test_a_listing_names_the_commits_and_the_strays(
    tmp_path: Path, names: list[str], commits: list[int], strays: list[str]
) -> None:
    listing, _ = lay_out(tmp_path, names)
    assert sorted(listing.commits) == commits
    assert all(listing.commits[c] == f"_delta_log/{v(c)}" for c in commits)
    assert listing.strays == strays
    assert (listing.last_checkpoint is not None) == ("_last_checkpoint" in names)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ([v(4, "checkpoint.parquet")], {4: [(CLASSIC, [v(4, "checkpoint.parquet")], True)]}),
        ([uuid_checkpoint(4, "parquet")], {4: [(V2, [uuid_checkpoint(4, "parquet")], True)]}),
        (
            [multipart(4, 2, 2), multipart(4, 1, 2)],
            {4: [(MULTIPART, [multipart(4, 1, 2), multipart(4, 2, 2)], True)]},  # in part order
        ),
        ([multipart(4, 1, 3), multipart(4, 3, 3)], {4: [(MULTIPART, [multipart(4, 1, 3), multipart(4, 3, 3)], False)]}),
        (
            [multipart(4, 1, 2), multipart(4, 1, 3), multipart(4, 2, 3), multipart(4, 3, 3)],
            {
                4: [
                    (MULTIPART, [multipart(4, 1, 3), multipart(4, 2, 3), multipart(4, 3, 3)], True),
                    (MULTIPART, [multipart(4, 1, 2)], False),
                ]
            },
        ),  # another part count is another checkpoint; the complete one first
        (
            [multipart(6, 1, 2), multipart(6, 2, 2), uuid_checkpoint(6), v(6, "checkpoint.parquet")],
            {
                6: [
                    (CLASSIC, [v(6, "checkpoint.parquet")], True),
                    (V2, [uuid_checkpoint(6)], True),
                    (MULTIPART, [multipart(6, 1, 2), multipart(6, 2, 2)], True),
                ]
            },
        ),  # several at one version: classic, then V2, then multi-part (deprecated)
        ([v(2, "checkpoint.parquet"), v(8, "checkpoint.parquet")], {2: [(CLASSIC, [v(2, "checkpoint.parquet")], True)], 8: [(CLASSIC, [v(8, "checkpoint.parquet")], True)]}),
    ],
    ids=["classic", "v2", "multipart", "multipart-missing-a-part", "two-part-counts", "preference", "by-version"],
)  # fmt: skip
def test_a_listing_groups_checkpoint_files_by_version_preferred_first(
    tmp_path: Path, names: list[str], expected: dict[int, list[tuple[CheckpointKind, list[str], bool]]]
) -> None:
    listing, _ = lay_out(tmp_path, names)
    assert checkpoints(listing) == expected


def test_a_part_number_beyond_the_part_count_is_a_stray_not_a_part(tmp_path: Path) -> None:
    listing, _ = lay_out(tmp_path, [multipart(4, 1, 2), v(4, "checkpoint.0000000003.0000000002.parquet")])
    assert checkpoints(listing) == {4: [(MULTIPART, [multipart(4, 1, 2)], False)]}
    assert listing.strays == [v(4, "checkpoint.0000000003.0000000002.parquet")]


def test_sidecars_are_the_files_directly_in_the_sidecar_folder(tmp_path: Path) -> None:
    listing, _ = lay_out(
        tmp_path, ["_sidecars/a.parquet", "_sidecars/b.parquet", "_sidecars/deeper/c.parquet"]
    )
    assert listing.sidecars == {"a.parquet", "b.parquet"}
    assert listing.strays == [] and listing.checkpoints == {}


# -- when a checkpoint is complete -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "v2_table", "complete"),
    [
        ({v(4, "checkpoint.parquet"): b"not read"}, False, True),  # a classic V1 checkpoint is one file
        ({multipart(4, 1, 2): b"", multipart(4, 2, 2): b""}, False, True),
        ({multipart(4, 1, 2): b""}, False, False),  # a missing part: readers must ignore it
        ({uuid_checkpoint(4): sidecar_lines("a.parquet"), "_sidecars/a.parquet": b""}, True, True),
        (
            {uuid_checkpoint(4): sidecar_lines("a.parquet", "b.parquet"), "_sidecars/a.parquet": b""},
            True,
            False,
        ),
        ({uuid_checkpoint(4): sidecar_lines()}, True, True),  # zero sidecars is allowed
        ({uuid_checkpoint(4): b"{not json"}, True, False),  # its sidecars cannot be known
        (
            {v(4, "checkpoint.parquet"): parquet_rows("sidecar", [{"path": "s.parquet"}, None])},
            True,
            False,
        ),  # classic-named in a v2Checkpoint table: V2 spec, so its sidecars count
        (
            {
                v(4, "checkpoint.parquet"): parquet_rows("sidecar", [{"path": "s.parquet"}, None]),
                "_sidecars/s.parquet": b"",
            },
            True,
            True,
        ),
    ],
    ids=[
        "classic",
        "multipart",
        "multipart-missing-a-part",
        "v2-with-its-sidecar",
        "v2-missing-a-sidecar",
        "v2-without-sidecars",
        "v2-unreadable",
        "classic-in-v2-table-missing-a-sidecar",
        "classic-in-v2-table-with-its-sidecar",
    ],
)
def test_a_checkpoint_is_complete_with_every_part_and_every_sidecar_it_references(
    tmp_path: Path, files: dict[str, bytes], v2_table: bool, complete: bool
) -> None:
    listing, refs = lay_out(tmp_path, files)
    (cp,) = listing.checkpoints[4]
    assert listing.is_complete(cp, refs, v2_table=v2_table) is complete
    assert (listing.complete_checkpoint(4, refs, v2_table=v2_table) is not None) is complete


@pytest.mark.parametrize(
    ("parts", "v2_name", "found"),
    [
        (None, None, [v(4, "checkpoint.parquet")]),  # the preferred complete one
        (3, None, [multipart(4, 1, 3), multipart(4, 2, 3), multipart(4, 3, 3)]),
        (2, None, None),  # only the 3-part one is there
        (None, uuid_checkpoint(4), [uuid_checkpoint(4)]),
        (None, v(4, "checkpoint.00000000-0000-0000-0000-000000000000.json"), None),  # another V2 file
    ],
)
def test_the_complete_checkpoint_asked_for_is_found_by_part_count_or_v2_name(
    tmp_path: Path, parts: int | None, v2_name: str | None, found: list[str] | None
) -> None:
    names = [v(4, "checkpoint.parquet"), uuid_checkpoint(4), *(multipart(4, p, 3) for p in (1, 2, 3))]
    listing, refs = lay_out(tmp_path, {**dict.fromkeys(names, b""), uuid_checkpoint(4): sidecar_lines()})
    cp = listing.complete_checkpoint(4, refs, parts=parts, v2_name=v2_name)
    assert (cp.names if cp else None) == found
    assert listing.complete_checkpoint(5, refs) is None  # nothing at another version


@pytest.mark.parametrize(
    ("body", "refs"),
    [
        (sidecar_lines("a.parquet"), ["a.parquet"]),
        (
            sidecar_lines("file:///lake/t/_delta_log/_sidecars/a%20b.parquet"),
            ["a b.parquet"],
        ),  # a URL: its name
        (sidecar_lines(), []),
        (b"\xff\xfe", None),  # unreadable: not complete
    ],
)
def test_a_v2_checkpoint_names_its_sidecars_by_file_name(
    tmp_path: Path, body: bytes, refs: list[str] | None
) -> None:
    _, sidecar_refs = lay_out(tmp_path, {uuid_checkpoint(4): body})
    assert sidecar_refs(f"_delta_log/{uuid_checkpoint(4)}") == refs
    assert sidecar_refs(f"_delta_log/{uuid_checkpoint(5)}") is None  # absent: not complete either
