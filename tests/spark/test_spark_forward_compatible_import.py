"""A log Delta-Spark wrote, carrying what a newer writer adds for forward compatibility, is imported
as readers read it: each line kept byte for byte, unknown keys and fields ignored (issue 11, item 1).

Spark writes the table (two appends, a DELETE); the test then adds, on the same lines, an unknown
top-level key beside ``commitInfo`` and unknown fields inside ``add`` (compact, as Jackson writes),
checks that Spark itself still reads the source, imports it, republishes it elsewhere and reads the
copy with Spark and deltalake.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from delta_mirror.jobs.importer import import_table
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import validate_table
from delta_mirror.store import SqlStore

LOG = "_delta_log"


def _with_future_fields(commit: Path) -> bytes:
    """The commit as a forward-compatible writer leaves it: same lines, extra keys (compact JSON)."""
    out = []
    for raw in commit.read_text(encoding="utf-8").splitlines():
        obj = json.loads(raw)
        if "commitInfo" in obj:
            obj["someFutureAction"] = {"kind": "audit", "tags": ["ü", None]}
        elif "add" in obj:
            obj["add"]["futureStatsV3"] = {"bloom": [1, 2, 3]}
        out.append(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))
    data = ("\n".join(out) + "\n").encode("utf-8")
    commit.write_bytes(data)
    return data


def _spark_view(spark: Any, folder: Path) -> tuple[int, int]:
    df = spark.read.format("delta").load(str(folder))
    history = spark.sql(f"DESCRIBE HISTORY delta.`{folder}`").selectExpr("max(version)").first()
    return int(history[0]), df.count()


def test_a_spark_log_with_unknown_keys_imports_byte_for_byte(spark: Any, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    rows = spark.createDataFrame([(i, f"e{i}") for i in range(6)], "id long, name string")
    rows.write.format("delta").save(str(src))
    more = spark.createDataFrame([(10, "e10"), (11, "e11")], "id long, name string")
    more.write.format("delta").mode("append").save(str(src))
    spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 1")
    commits = sorted((src / LOG).glob("*.json"))
    assert len(commits) == 3
    originals = {int(c.name.split(".")[0]): _with_future_fields(c) for c in commits}
    for crc in (src / LOG).glob("*.crc"):  # Spark's checksums no longer match the edited commits
        crc.unlink()
    spark.catalog.clearCache()
    assert _spark_view(spark, src) == (2, 7)  # the reference reader accepts the edited log

    store = SqlStore(f"sqlite:///{tmp_path}/store.db")
    store.init()
    result = import_table(store, str(src), name="fc", location=str(dst))
    assert (result.start_version, result.end_version, result.commits) == (0, 2, 3)
    for path in src.iterdir():  # the data files beside the copy's log
        if path.name != LOG:
            (shutil.copytree if path.is_dir() else shutil.copy2)(path, dst / path.name)
    assert Publisher(store).publish("fc").last_published == 2

    for version, data in originals.items():
        assert (dst / LOG / f"{version:020d}.json").read_bytes() == data
    assert _spark_view(spark, dst) == (2, 7)
    dt = DeltaTable(str(dst))
    assert dt.version() == 2 and dt.to_pyarrow_table().num_rows == 7
    assert validate_table(store, "fc").problems == []
