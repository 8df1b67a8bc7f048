"""The core library never imports Airflow; its public names are what ``__all__`` says."""

from __future__ import annotations

import json
import pkgutil

from support.processes import fresh_python

import delta_mirror

CORE_MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(delta_mirror.__path__, "delta_mirror.")
    if not m.name.startswith("delta_mirror.airflow") and ".migrations" not in m.name
)


def test_every_core_module_imports_without_pulling_in_airflow() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {CORE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.'))))\n"
    )
    assert json.loads(fresh_python(code)) == []
    assert "delta_mirror.jobs.publisher" in CORE_MODULES and "delta_mirror.store.sql_store" in CORE_MODULES


def test_core_modules_declare_their_public_names() -> None:
    import importlib

    for name in CORE_MODULES:
        module = importlib.import_module(name)
        if name.endswith("__main__") or name in ("delta_mirror.dev.demo", "delta_mirror.cli"):
            continue
        assert hasattr(module, "__all__"), f"{name} has no __all__"
        for public in module.__all__:
            assert hasattr(module, public), f"{name}.__all__ names missing {public}"


def test_the_public_api_is_reexported_from_the_package_and_loaded_lazily() -> None:
    code = (
        "import json, sys, delta_mirror\n"
        "heavy = sorted(m for m in ('sqlalchemy', 'pyarrow', 'deltalake') if m in sys.modules)\n"
        "missing = [n for n in delta_mirror.__all__ if getattr(delta_mirror, n, None) is None]\n"
        "print(json.dumps([heavy, missing]))\n"
    )
    assert json.loads(fresh_python(code)) == [[], []]
    assert {"SqlStore", "Publisher", "import_table", "validate_table", "reconcile"} <= set(
        delta_mirror.__all__
    )


def test_the_checkpoint_package_and_its_model_load_without_arrow() -> None:
    # the local engine imports the model before it sends the store's read of the active files and
    # the layouts (pyarrow, ~0.1 s) after it, under the server's join; the package itself must
    # therefore load its names on first use (issue 31)
    code = (
        "import json, sys\n"
        "import delta_mirror.delta.checkpoint\n"
        "from delta_mirror.delta.checkpoint.model import CheckpointInput\n"
        "before = 'pyarrow' in sys.modules\n"
        "from delta_mirror.delta.checkpoint import build_checkpoint, spark_hash_partition\n"
        "print(json.dumps([before, 'pyarrow' in sys.modules]))\n"
    )
    assert json.loads(fresh_python(code)) == [False, True]
