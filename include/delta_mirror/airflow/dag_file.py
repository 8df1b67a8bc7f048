"""The user's DAG file: every delta-mirror DAG of a table config, from any dags folder or DAG bundle.

```python
from delta_mirror.airflow import dags_from_config

globals().update(dags_from_config("/etc/delta-mirror/tables.yaml"))
```

Without an argument the config is ``DELTA_MIRROR_CONFIG`` (docs/install.md).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from delta_mirror.table_config import load_config

CONFIG_ENV = "DELTA_MIRROR_CONFIG"


def config_path(path: str | os.PathLike[str] | None, dag_file: str | None) -> Path | None:
    """The config file ``path`` names: ``~`` expanded, a relative path from the DAG file's folder
    (a DAG bundle's files move with each version, the config beside them); ``None`` without one."""
    if path is None:
        return None
    found = Path(path).expanduser()
    if not found.is_absolute():
        found = (Path(dag_file).resolve().parent if dag_file else Path.cwd()) / found
    return found


def dags_from_config(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The DAGs of the table config at ``path`` (else ``DELTA_MIRROR_CONFIG``), by DAG id.

    A path given here also becomes this process's ``DELTA_MIRROR_CONFIG``: the tasks parsed from
    this file read their table's settings from the same config at run time.
    """
    from delta_mirror.airflow.dag_factory import build_dags

    frame = inspect.currentframe()
    caller = frame.f_back.f_globals.get("__file__") if frame is not None and frame.f_back else None
    found = config_path(path, caller if isinstance(caller, str) else None)
    if found is not None:
        os.environ[CONFIG_ENV] = str(found)
    return dict(build_dags(load_config(found)))


__all__ = ["CONFIG_ENV", "config_path", "dags_from_config"]
