"""Airflow plugin entry: the "Delta Mirror" page (mounted at /delta-mirror by the API server)."""

from delta_mirror.airflow.ui_plugin import DeltaMirrorPlugin

__all__ = ["DeltaMirrorPlugin"]
