"""The published frontier (``jobs/published_frontier.py``) on a real local log: found with a few
HEADs, and kept off the commit service's hot path by ``PublishedFrontiers`` (learned on first sight,
after a reconnect, when a post is at or below an acknowledged version, after its TTL; otherwise no
storage request at all)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.builders import add, write_commit

from delta_mirror.delta.object_store import ObjectMeta
from delta_mirror.errors import StoreBehindError
from delta_mirror.jobs.published_frontier import PublishedFrontiers, published_frontier
from delta_mirror.storage import ObjectStore, open_store


class _Counting:
    """An ``ObjectStore`` that counts its HEADs and GETs."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.uri = inner, inner.uri
        self.heads = self.gets = 0

    def head(self, path: str) -> ObjectMeta | None:
        self.heads += 1
        return self.inner.head(path)

    def get(self, path: str) -> bytes | None:
        self.gets += 1
        return self.inner.get(path)

    def list(self, prefix: str) -> list[ObjectMeta]:
        raise AssertionError("the frontier is found without listing")


def _log(root: Path, versions: int) -> None:
    for v in range(versions):
        write_commit(root, v, [add(f"p{v}.parquet")])


@pytest.mark.parametrize("published", [0, 1, 2, 3, 17, 100])
def test_the_frontier_is_found_with_logarithmically_many_heads(tmp_path: Path, published: int) -> None:
    _log(tmp_path, published)
    objects = _Counting(open_store(tmp_path.as_uri()))
    assert published_frontier(objects, 0) == published - 1  # type: ignore[arg-type]
    assert objects.heads <= 2 + 2 * max(1, published).bit_length()
    objects.heads = 0
    assert published_frontier(objects, published) == published - 1  # type: ignore[arg-type]
    assert objects.heads == 1  # not behind: one HEAD


def test_a_steady_stream_of_commits_costs_no_storage_request(tmp_path: Path) -> None:
    _log(tmp_path, 3)
    counting = _Counting(open_store(tmp_path.as_uri()))
    now = [0.0]
    frontiers = PublishedFrontiers(open_location=lambda _loc: counting, clock=lambda: now[0])  # type: ignore[arg-type, return-value]
    root = tmp_path.as_uri()
    frontiers.check(root, 3, b"x")  # first sight: learned (3.json absent: one HEAD)
    frontiers.acknowledged(root, 3)
    assert (counting.heads, frontiers.lookups) == (1, 1)
    for v in range(4, 200):
        frontiers.check(root, v, b"x")
        frontiers.acknowledged(root, v)
    assert (counting.heads, counting.gets, frontiers.lookups) == (1, 0, 1)
    now[0] = 11.0  # past the TTL: learned again, once
    frontiers.check(root, 200, b"x")
    assert frontiers.lookups == 2


def test_the_store_going_back_is_noticed_and_refused_until_the_bytes_match(tmp_path: Path) -> None:
    _log(tmp_path, 2)
    counting = _Counting(open_store(tmp_path.as_uri()))
    frontiers = PublishedFrontiers(open_location=lambda _loc: counting)  # type: ignore[arg-type, return-value]
    root = tmp_path.as_uri()
    frontiers.check(root, 2, b"x")
    for v in (2, 3, 4):
        frontiers.acknowledged(root, v)
        write_commit(tmp_path, v, [add(f"p{v}.parquet")])  # the LogStore writes it after the answer
    # the store went back to 1 (a failover): the next post is at or below what was acknowledged
    with pytest.raises(StoreBehindError) as caught:
        frontiers.check(root, 2, b"other bytes", name="t")
    assert caught.value.behind == 3 and "recover t" in caught.value.message
    frontiers.check(root, 2, (tmp_path / "_delta_log" / f"{2:020d}.json").read_bytes())  # the same bytes pass
    frontiers.forget()  # a reconnect: everything is learned again
    lookups = frontiers.lookups
    with pytest.raises(StoreBehindError):
        frontiers.check(root, 3, b"other bytes")
    assert frontiers.lookups == lookups + 1


def test_a_root_without_a_log_or_credentials_is_not_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    frontiers = PublishedFrontiers()
    new_root = tmp_path / "new"
    frontiers.check(new_root.as_uri(), 0, b"x")
    assert not new_root.exists()  # no folder created by the check
    frontiers.check("s3://bucket/t", 5, b"x")  # no credentials: not checked (said once in the log)


def test_a_commit_published_between_the_publishers_two_reads_is_not_a_store_behind(tmp_path: Path) -> None:
    """The publisher reads the store's latest, then HEADs the next ``<v>.json``; a writer whose
    LogStore commits and publishes v in between must not make it say "store behind" (a
    ``<v>.json`` only follows v in the store, so the store read again after the HEADs decides)."""
    from support.commit_service import FIRST_COMMIT, add_line, commit_file
    from support.stores import sqlite_store

    from delta_mirror.jobs.recover import check_not_behind

    root = tmp_path / "t"
    _url, store = sqlite_store(tmp_path)

    def body(v: int) -> bytes:
        return FIRST_COMMIT if v == 0 else commit_file(add_line(f"p{v}.parquet"))

    for v in range(2):
        store.commit_verbatim(root.as_uri(), v, body(v), create_name="t")
        (write_commit(root, v, [])).write_bytes(body(v))
    table = store.get_table("t")
    inner = open_store(root.as_uri())

    class _WriterInBetween(_Counting):
        def head(self, path: str) -> ObjectMeta | None:
            if self.heads == 0:  # the first HEAD (of 2.json): a writer commits 2 and publishes it
                store.commit_verbatim(root.as_uri(), 2, body(2))
                write_commit(root, 2, []).write_bytes(body(2))
            return super().head(path)

    check_not_behind(store, table, _WriterInBetween(inner))  # type: ignore[arg-type]
    # and a store really behind is still said so
    write_commit(root, 3, [add("p3.parquet")])
    write_commit(root, 4, [add("p4.parquet")])
    with pytest.raises(StoreBehindError, match="store behind published log by 2 versions"):
        check_not_behind(store, table, inner)
    store.close()
