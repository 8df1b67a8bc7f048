"""Airflow glue: hooks, operators, triggers and notifications over the core library.

Everything here is a thin shell: operators call one core service and translate its errors in one
place (``errors.py``). The core (``delta_mirror`` outside this package) never imports Airflow.
"""
