"""One table root, however it is spelled (issue 39 finding 8), at every entry point that stores a
location: ``delta-mirror import``, ``delta-mirror commit --location``, the store's API and the commit
service after a CLI import; the publisher then writes to the stored location.

``s3a://b/warehouse//t``, ``s3://b/warehouse/t/`` and ``s3://b/warehouse/%74`` are one root: each
entry point stores ``s3://b/warehouse/t`` and refuses a second table at another spelling. The one
normaliser is ``delta.locations.normalize_table_root`` (``storage.normalize_location`` is it).
Against a real S3-protocol server (``s3_env``) and a real SQLite store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner, Result
from deltalake import DeltaTable, write_deltalake
from support.builders import METADATA, PROTOCOL, add, lines
from support.commit_service import CommitService, add_line, commit_file
from support.services import S3Server
from support.stores import sqlite_store

from delta_mirror.cli import cli
from delta_mirror.delta.locations import normalize_table_root
from delta_mirror.errors import PermanentError
from delta_mirror.storage import normalize_commit_root, normalize_location

SPELLINGS = [
    "s3a://{b}/warehouse//t",
    "s3://{b}/warehouse/t/",
    "s3://{b}/warehouse/%74",
    "S3A://{b}//warehouse/t",
]


def spelled(bucket: str) -> list[str]:
    return [s.format(b=bucket) for s in SPELLINGS]


def run(url: str, *args: str, data: bytes | None = None) -> Result:
    return CliRunner().invoke(cli, ["--store", url, *args], input=data, env={"DELTA_MIRROR_STORE": None})


def source_table(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    """A Delta table of two versions (deltalake's own writer) uploaded to ``s3://bucket/warehouse/t``."""
    local = tmp_path / "source"
    write_deltalake(str(local), pa.table({"id": pa.array([1, 2], pa.int64())}))
    write_deltalake(str(local), pa.table({"id": pa.array([3], pa.int64())}), mode="append")
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        s3.client().put_object(
            Bucket=bucket, Key=f"warehouse/t/{path.relative_to(local)}", Body=path.read_bytes()
        )


def test_the_storage_normaliser_is_the_one_of_delta_locations() -> None:
    assert normalize_location is normalize_table_root
    assert normalize_commit_root is normalize_table_root


@pytest.mark.parametrize("index", range(len(SPELLINGS)))
def test_cli_import_stores_one_spelling_refuses_a_twin_and_publishes_there(
    s3_env: str, s3: S3Server, tmp_path: Path, index: int
) -> None:
    bucket = s3_env
    source_table(s3, bucket, tmp_path)
    url, store = sqlite_store(tmp_path)
    try:
        given, *others = spelled(bucket)[index:] + spelled(bucket)[:index]
        done = run(url, "import", given, "--table", "t")
        assert done.exit_code == 0, done.output
        assert store.get_table("t").location == f"s3://{bucket}/warehouse/t"
        for twin in others:
            refused = run(url, "import", twin, "--table", "t2")
            assert refused.exit_code == 1 and "overlaps table 't'" in refused.stderr, refused.stderr
        assert [t.name for t in store.list_tables()] == ["t"]
        # the publisher writes where the store says: version 2 lands beside the source's 0 and 1
        committed = run(url, "commit", "t", "--actions", "-", data=lines(add("more.parquet", size=10)))
        assert committed.exit_code == 0 and committed.output.strip() == "2", committed.output
        published = run(url, "mirror", "t")
        assert published.exit_code == 0, published.output
        table = DeltaTable(f"s3://{bucket}/warehouse/t", storage_options=s3.env())
        assert table.version() == 2
    finally:
        store.close()


@pytest.mark.parametrize("index", range(len(SPELLINGS)))
def test_cli_commit_location_stores_one_spelling_and_refuses_a_twin(
    s3_env: str, tmp_path: Path, index: int
) -> None:
    bucket = s3_env
    url, store = sqlite_store(tmp_path)
    try:
        given, *others = spelled(bucket)[index:] + spelled(bucket)[:index]
        create = lines(PROTOCOL, METADATA, add("a.parquet"))
        done = run(url, "commit", "t", "--actions", "-", "--location", given, data=create)
        assert done.exit_code == 0, done.output
        assert store.get_table("t").location == f"s3://{bucket}/warehouse/t"
        for twin in others:
            refused = run(url, "commit", "t2", "--actions", "-", "--location", twin, data=create)
            assert refused.exit_code == 1 and "overlaps table 't'" in refused.stderr, refused.stderr
        assert [t.name for t in store.list_tables()] == ["t"]
    finally:
        store.close()


def test_the_store_api_stores_one_spelling_and_refuses_a_bad_root_naming_the_table(tmp_path: Path) -> None:
    _, store = sqlite_store(tmp_path)
    try:
        assert store.create_table("t", "s3a://lake/warehouse//t/").location == "s3://lake/warehouse/t"
        assert store.create_table("u", "s3://lake/warehouse/%75").location == "s3://lake/warehouse/u"
        with pytest.raises(PermanentError) as refused:
            store.create_table("v", "s3://lake/warehouse/v\x00")
        assert refused.value.message.startswith("table 'v': invalid table root")
        assert "\n" not in refused.value.message
        assert [t.name for t in store.list_tables()] == ["t", "u"]
    finally:
        store.close()


def test_the_service_commits_to_a_table_the_cli_imported_under_another_spelling(
    s3_env: str, s3: S3Server, tmp_path: Path
) -> None:
    bucket = s3_env
    source_table(s3, bucket, tmp_path)
    url, store = sqlite_store(tmp_path)
    service = CommitService(url, [f"s3a://{bucket}/warehouse/"], log_path=tmp_path / "serve.log")
    try:
        assert run(url, "import", f"s3a://{bucket}/warehouse//t", "--table", "t").exit_code == 0
        service.start()
        answer: Any = service.post(f"s3://{bucket}/warehouse/t/", 2, commit_file(add_line("b.parquet")))
        assert answer.status == 201, answer.body
        assert [(t.name, t.location) for t in store.list_tables()] == [("t", f"s3://{bucket}/warehouse/t")]
        assert store.latest_version(store.get_table("t").id) == 2
    finally:
        service.stop()
        store.close()
