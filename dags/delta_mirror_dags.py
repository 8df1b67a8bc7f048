"""Airflow DAG file: every delta-mirror DAG, generated from the table config (``DELTA_MIRROR_CONFIG``;
``make airflow`` points it at config/delta_mirror.yaml).

The same three lines a team puts in its own dags folder (docs/install.md). The factory re-reads the
config at each parse, so table edits need no restart; the logic lives in the installed
``delta_mirror`` package, not on Airflow's path.
"""

from delta_mirror.airflow import dags_from_config

globals().update(dags_from_config())
