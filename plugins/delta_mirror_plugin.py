"""Airflow plugin file: the "Delta Mirror" page, for a package on the path without its metadata.

The installed package (``pip install delta-mirror[airflow]``, or ``pip install -e .`` as ``make venv``
does) registers the page itself, by its ``airflow.plugins`` entry point: this file then defines
nothing, since Airflow refuses a second plugin of the same name and reports it as an import error.
It registers the page only where the package is importable but not installed (``PYTHONPATH=include``).
"""

from importlib.metadata import entry_points

if not any(ep.name == "delta_mirror" for ep in entry_points(group="airflow.plugins")):
    from delta_mirror.airflow.ui_plugin import DeltaMirrorPlugin

    __all__ = ["DeltaMirrorPlugin"]
