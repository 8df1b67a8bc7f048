"""The "Delta Mirror" page of the Airflow UI: an ``AirflowPlugin`` with a FastAPI app and a nav entry.

Mounted by Airflow's API server under ``/delta-mirror``:

- ``/delta-mirror/`` overview (HTML): one row per table; ``/delta-mirror/tables/<name>``: lag over
  time (inline SVG, no JavaScript, no CDN), version timeline with failures and retries, checkpoints;
- ``/delta-mirror/api/overview``, ``/delta-mirror/api/tables/<name>``: the same data as JSON;
- ``/delta-mirror/api/health``: 200 when every table is healthy, 503 otherwise (for probes).

Three parts: what the pages show is ``delta_mirror.health.pages`` (from the store, no HTML, no
Airflow); how they look is ``ui_render`` (Jinja2 templates in ``ui_templates/``, style and script in
``ui_static/``); the app, its login on every route and who may see which table (a table's own DAG
decides) is ``ui_app``. This module registers the app with Airflow.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from delta_mirror.airflow.ui_app import create_app
from delta_mirror.airflow.ui_render import URL_PREFIX


class DeltaMirrorPlugin(AirflowPlugin):
    """Registered by ``plugins/delta_mirror_plugin.py`` (Airflow's plugins folder)."""

    name = "delta_mirror"
    fastapi_apps: list[Any] = [  # noqa: RUF012  # AirflowPlugin declares it an instance attribute
        {"app": create_app(), "url_prefix": URL_PREFIX, "name": "Delta Mirror"}
    ]
    external_views: list[Any] = [  # noqa: RUF012  # as fastapi_apps
        {
            "name": "Delta Mirror",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": "delta-mirror",
        }
    ]


__all__ = ["URL_PREFIX", "DeltaMirrorPlugin", "create_app"]
