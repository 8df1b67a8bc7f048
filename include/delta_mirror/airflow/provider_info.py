"""Provider metadata for Airflow's ``apache_airflow_provider`` entry point (``pyproject.toml``).

``airflow providers list`` (and the UI's Providers page) show delta-mirror from it, and the
connection type ``delta_mirror`` (``DeltaMirrorHook``'s store connection) has a form in the UI. It follows Airflow's
``provider_info.schema.json``; ``package-name`` must be the distribution's own name, or Airflow
refuses the provider.

The "Delta Mirror" page is registered once, by the ``airflow.plugins`` entry point: listed under
``plugins`` here too, an Airflow with ``[core] lazy_discover_providers = False`` would load it a
second time and report "Plugin 'delta_mirror' already registered" as a plugin import error.
Nothing here imports Airflow: the providers manager calls this before it loads any hook.
"""

from __future__ import annotations

from typing import Any

from delta_mirror.version import __version__

PACKAGE_NAME = "delta-mirror"
HOOK = "delta_mirror.airflow.hooks.DeltaMirrorHook"
CONNECTION_TYPE = "delta_mirror"


def get_provider_info() -> dict[str, Any]:
    """The provider's description, versions, hooks and connection type. No ``notifications``: alerts
    use the SMTP provider's ``SmtpNotifier`` or a notifier the table config names (notifications.py)."""
    return {
        "package-name": PACKAGE_NAME,
        "name": "Delta Mirror",
        "description": "Keeps Delta Lake tables readable by every Delta reader while a SQL database is "
        "the authority for their transaction logs: DAGs from a table config, operators, a trigger "
        "and the *Delta Mirror* page.",
        "versions": [__version__],
        "integrations": [{"integration-name": "Delta Mirror", "tags": ["software"]}],
        "hooks": [{"integration-name": "Delta Mirror", "python-modules": ["delta_mirror.airflow.hooks"]}],
        "operators": [
            {"integration-name": "Delta Mirror", "python-modules": ["delta_mirror.airflow.operators"]}
        ],
        "triggers": [
            {"integration-name": "Delta Mirror", "python-modules": ["delta_mirror.airflow.triggers"]}
        ],
        "connection-types": [
            {
                "connection-type": CONNECTION_TYPE,
                "hook-class-name": HOOK,
                "hook-name": "Delta Mirror",
                # the form without importing the hook (Airflow 3.2+): a PostgreSQL store's fields, or
                # any store's SQLAlchemy URL in the extra
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {"schema": "Database"},
                    "placeholders": {
                        "host": "PostgreSQL host of the store",
                        "extra": '{"sqlalchemy_url": "postgresql+psycopg://user:password@host:5432/db"}',
                    },
                },
            }
        ],
    }


__all__ = ["CONNECTION_TYPE", "HOOK", "PACKAGE_NAME", "get_provider_info"]
