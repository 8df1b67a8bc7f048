"""Compatibility shim: the services moved to ``support/services.py``; import them from there.

Kept for test modules owned elsewhere that still say ``from services import ...``.
"""

from support.services import *  # noqa: F403
from support.services import _wait_port  # noqa: F401
