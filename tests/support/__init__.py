"""Shared test support: real services (``services``), an SMTP catcher (``mailserver``), Delta action
builders (``builders``), helpers for the ``delta-mirror`` executable (``cli``) and its commit service
(``commit_service``), the shared SparkSession (``spark``), checkpoint round trips through deltalake
(``checkpoint_roundtrip``) and the generated bad input (``bad_input``).

Imported as ``support.*``: ``tests/`` is on ``sys.path`` through pytest's ``pythonpath`` option
(pyproject.toml) and, for ``make bench`` / ``make chaos``, through ``PYTHONPATH``; nothing edits
``sys.path`` to reach it. mypy finds it through ``mypy_path``.
"""
