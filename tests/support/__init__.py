"""Shared test support: real services (``services``), an SMTP catcher (``mailserver``), Delta action
builders (``builders``) and helpers for the ``delta-mirror`` executable (``cli``).

Imported as ``support.*``: ``tests/`` is on ``sys.path`` through pytest's ``pythonpath`` option
(pyproject.toml) and, for ``make bench`` / ``make chaos``, through ``PYTHONPATH``; nothing edits
``sys.path`` to reach it. mypy finds it through ``mypy_path``.
"""
