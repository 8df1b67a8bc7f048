"""Shared test support: real services (``services``), an SMTP catcher (``mailserver``), Delta action
builders (``builders``) and helpers for the ``delta-mirror`` executable (``cli``).

Imported as ``support.*``: pytest puts ``tests/`` on ``sys.path`` for ``tests/conftest.py`` (no
``__init__.py`` there), so no test edits ``sys.path`` to reach it.
"""
