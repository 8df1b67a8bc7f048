"""Airflow DAG file: every delta-mirror DAG, generated from config/delta_mirror.yaml.

The factory re-reads the config at each parse, so table edits need no restart. The logic lives in
the installed ``delta_mirror`` package (``pip install -e .``), not on Airflow's path.
"""

from __future__ import annotations

from delta_mirror.airflow.dag_factory import build_dags

globals().update(build_dags())
