"""`make demo`: the main job on the embedded default (SQLite store, local folder).

Creates a demo table, commits a few versions, publishes them with a checkpoint, validates the
result with deltalake and prints the table as deltalake reads it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from delta_mirror.config import home
from delta_mirror.dev.datafiles import create_table_actions, write_data_file
from delta_mirror.errors import TableNotFoundError
from delta_mirror.health.monitoring import record_lag_sample
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import validate_table
from delta_mirror.storage import local_path
from delta_mirror.store import SqlStore

TABLE = "demo"


def prepare() -> Path:
    """Create the demo table and commit a few versions (nothing published yet)."""
    root = home()
    store = SqlStore()
    store.init()
    location = (root / "tables" / TABLE).resolve()
    try:
        old = store.get_table(TABLE)
        store.delete_table(old.id)
        old_path = local_path(old.location)
        if old_path is not None:
            shutil.rmtree(old_path, ignore_errors=True)
    except TableNotFoundError:
        pass
    shutil.rmtree(location, ignore_errors=True)
    location.mkdir(parents=True)
    store.create_table(TABLE, location.as_uri())
    schema = pa.schema([("id", pa.int64()), ("city", pa.string()), ("amount", pa.float64())])
    print(f"store:    {store.display_url}")
    print(f"location: {location.as_uri()}")

    batches = [
        pa.table(
            {"id": [1, 2, 3], "city": ["Lisbon", "Oslo", "Lima"], "amount": [9.5, 20.0, 3.25]}, schema=schema
        ),
        pa.table({"id": [4, 5], "city": ["Quito", "Accra"], "amount": [11.0, 7.75]}, schema=schema),
        pa.table({"id": [6], "city": ["Hanoi"], "amount": [42.0]}, schema=schema),
    ]
    first = create_table_actions(schema, configuration={"delta.checkpointInterval": "3"})
    version = store.commit(TABLE, [*first, ("add", write_data_file(location, batches[0]))])
    print(f"committed version {version}: create + 3 rows")
    _measure_lag(store)
    adds = []
    for batch in batches[1:]:
        time.sleep(1)  # so the lag samples below show a backlog growing over a few seconds
        add = write_data_file(location, batch)
        adds.append(add)
        version = store.commit(TABLE, [("add", add)])
        print(f"committed version {version}: +{batch.num_rows} rows")
        _measure_lag(store)
    version = store.commit(
        TABLE,
        [
            (
                "remove",
                {
                    "path": adds[-1]["path"],
                    "deletionTimestamp": add["modificationTime"],
                    "dataChange": True,
                    "size": add["size"],
                },
            )
        ],
    )
    print(f"committed version {version}: delete the Hanoi file")
    _measure_lag(store)
    return location


def _measure_lag(store: SqlStore) -> None:
    """A real lag sample (as the monitor records), so the UI's lag chart is not empty after the demo."""
    sample = record_lag_sample(store, TABLE)
    print(
        f"          lag sample: {sample.lag_seconds:.1f} s, {sample.versions_behind} version(s) unpublished"
    )


def publish() -> None:
    """Publish without Airflow (the core library alone)."""
    result = Publisher(SqlStore()).publish(TABLE)
    print(
        f"published versions {result.published[0]}..{result.last_published}; "
        f"checkpoint at {result.checkpoints or 'none'}"
    )


def show() -> None:
    """Validate the published table and print it as deltalake reads it."""
    store = SqlStore()
    location = local_path(store.get_table(TABLE).location)
    assert location is not None
    report = validate_table(store, TABLE)
    for p in report.problems:
        print(f"PROBLEM [{p.kind}] {p.message}")
    print(f"validate: {'OK' if report.ok else 'FAILED'} ({report.versions_checked} versions checked)")

    dt = DeltaTable(location.as_uri())
    rows = QueryBuilder().register("demo", dt).execute("select * from demo order by id").read_all()
    print(f"\ndeltalake reads version {dt.version()} of {location.as_uri()}:")
    print(_format(pa.table(rows)))
    log = sorted(p.name for p in (location / "_delta_log").iterdir())
    print("\n_delta_log/: " + ", ".join(log))
    if not report.ok:
        raise SystemExit(1)


def _format(table: pa.Table) -> str:
    """A plain text grid (no pandas needed)."""
    rows = [[str(v) for v in r.values()] for r in table.to_pylist()]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(table.column_names)]
    line = "  ".join(c.ljust(w) for c, w in zip(table.column_names, widths, strict=True))
    body = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([line, *body])


def airflow() -> None:
    """Run the table's DAG through Airflow (`airflow dags test`) on the embedded default.

    Airflow's SQLite metadata DB lives in ``$AIRFLOW_HOME`` (the Makefile points it at ./.airflow).
    Airflow is run as a command, so this module still imports nothing of it.
    """
    airflow_home = Path(os.environ.setdefault("AIRFLOW_HOME", str(Path(".airflow").resolve())))
    airflow_home.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    airflow_cmd = str(bin_dir / "airflow")
    log = airflow_home / "demo.log"
    with log.open("w") as out:
        print(f"airflow:  initialising the metadata DB in {airflow_home} (log: {log})")
        subprocess.run(
            [airflow_cmd, "db", "migrate"], env=env, stdout=out, stderr=subprocess.STDOUT, check=True
        )
        print(f"airflow:  dags test delta_mirror__{TABLE} (publish -> checkpoint -> validate -> metrics)")
        run = subprocess.run(
            [airflow_cmd, "dags", "test", f"delta_mirror__{TABLE}"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    states = [
        line
        for line in log.read_text().splitlines()
        if "new_state=" in line and "Task instance state" in line
    ]
    print(
        f"airflow:  {len([s for s in states if 'new_state=success' in s])} task(s) succeeded, "
        f"{len([s for s in states if 'new_state=failed' in s or 'up_for_retry' in s])} failed"
    )
    if run.returncode != 0:
        print(f"airflow dags test failed; see {log}")
        raise SystemExit(run.returncode)


STEPS = {"prepare": prepare, "publish": publish, "airflow": airflow, "show": show}


def main(argv: list[str] | None = None) -> None:
    steps = (argv if argv is not None else sys.argv[1:]) or ["prepare", "publish", "show"]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise SystemExit(f"unknown demo step(s) {unknown}; steps: {', '.join(STEPS)}")
    for step in steps:
        STEPS[step]()


if __name__ == "__main__":
    main()
