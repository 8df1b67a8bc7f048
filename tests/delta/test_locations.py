"""``delta_mirror.delta.locations``: a table root normalised once (issue 39 finding 8), and the
store's overlap check comparing locations through it."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.stores import sqlite_store

from delta_mirror.delta.locations import (
    MAX_SEGMENT_BYTES,
    location_key,
    normalize_table_root,
    same_or_nested,
)
from delta_mirror.errors import PermanentError


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("s3a://lake/warehouse//t", "s3://lake/warehouse/t"),
        ("s3n://lake/warehouse/t/", "s3://lake/warehouse/t"),
        ("S3A://lake/warehouse/t", "s3://lake/warehouse/t"),
        ("s3://lake/warehouse/%74", "s3://lake/warehouse/t"),
        ("s3://lake/a%20b", "s3://lake/a b"),
        ("s3://lake/a b", "s3://lake/a b"),
        ("s3://lake/100%25", "s3://lake/100%25"),
        ("s3://lake/a%3Fb", "s3://lake/a%3Fb"),
        ("gs://bucket//x///", "gs://bucket/x"),
        ("abfss://c@acct.dfs.core.windows.net/t/", "abfss://c@acct.dfs.core.windows.net/t"),
        ("file:/data//sales/", "file:///data/sales"),
        ("file:///data/sales", "file:///data/sales"),
        ("file://localhost/data/sales", "file:///data/sales"),
        ("/data/sales", "file:///data/sales"),
    ],
)
def test_every_spelling_of_a_root_normalises_to_one(given: str, kept: str) -> None:
    assert normalize_table_root(given) == kept
    assert normalize_table_root(kept) == kept, "normalising twice changes nothing"
    assert location_key(given) == location_key(kept)


@pytest.mark.parametrize(
    "root",
    [
        "",
        "s3://lake/t\x00",
        "s3://lake/t%00",
        "s3://lake/t\n",
        "s3://lake/t\x7f",
        "s3://lake/t.",
        "s3://lake/./t",
        "s3://lake/../t",
        "s3://lake/%2e%2e/t",
        "s3://lake/a%2Fb",
        "s3://lake/%ff",
        "s3://lake/a\\b",
        "s3://lake/t?x=1",
        "s3://lake/t#x",
        "s3://",
        "s3:lake/t",
        "http://lake/t",
        "file://elsewhere/data/t",
        "file:data/t",
        "file:/data/t.",
        "file:/data/../t",
        "s3://lake/" + "a" * (MAX_SEGMENT_BYTES + 1),
        "s3://lake/" + "é" * 128,
        "s3://lake/" + "a/" * 3000,
        "file:/data/" + "a" * 5000,
    ],
    ids=lambda r: repr(r[:30]),
)
def test_a_root_that_is_no_table_uri_is_refused_in_one_line(root: str) -> None:
    with pytest.raises(PermanentError) as refused:
        normalize_table_root(root)
    assert "\n" not in refused.value.message and len(refused.value.message) < 400


def test_a_segment_of_255_bytes_is_accepted() -> None:
    assert normalize_table_root("s3://lake/" + "a" * 255) == "s3://lake/" + "a" * 255


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("s3://lake/w/t", "s3://lake/w//t", True),
        ("s3://lake/w/t", "s3a://lake/w/t/x", True),
        ("s3://lake/w/t", "s3://lake/w/t2", False),
        ("file:///data", "file:///data/x", True),
        ("file:///data", "file:///database", False),
        ("s3://lake/a%20b", "s3://lake/a b/c", True),
        ("s3://lake/w", "gs://lake/w", False),
    ],
)
def test_locations_overlap_when_their_keys_nest(a: str, b: str, overlap: bool) -> None:
    assert same_or_nested(a, b) is overlap
    assert same_or_nested(b, a) is overlap


def test_the_store_refuses_a_second_table_at_another_spelling_of_a_root(tmp_path: Path) -> None:
    _, store = sqlite_store(tmp_path)
    try:
        store.create_table("t", "s3://lake/warehouse/t")
        for twin in ("s3://lake/warehouse//t", "s3://lake//warehouse/t/x", "s3a://lake/warehouse/t"):
            with pytest.raises(PermanentError, match="overlaps table 't'"):
                store.create_table("t2", twin)
        assert [t.name for t in store.list_tables()] == ["t"]
    finally:
        store.close()


def test_a_plain_local_path_may_say_dot_and_dot_dot_as_a_shell_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert normalize_table_root("../t") == (tmp_path / "t").as_uri()
    assert normalize_table_root("./t/") == (tmp_path / "a" / "t").as_uri()
    assert normalize_table_root(f"{tmp_path}/a/../t") == (tmp_path / "t").as_uri()
    for uri in (f"file:{tmp_path}/a/../t", f"file://{tmp_path}/./t", "s3://lake/a/../t"):
        with pytest.raises(PermanentError, match=r"'\.\.' or ends in '\.'"):
            normalize_table_root(uri)
    with pytest.raises(PermanentError, match=r"ends in '\.'"):
        normalize_table_root("../t.")
