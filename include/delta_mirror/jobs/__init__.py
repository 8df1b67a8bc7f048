"""Jobs: the work done on a table — publish, import, reconcile, maintain, validate.

Each job reads the authority through ``delta_mirror.store`` and the Delta log model in
``delta_mirror.delta``; none of them imports Airflow (operators in ``delta_mirror.airflow`` call them).
"""

__all__: list[str] = []
