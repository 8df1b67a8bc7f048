"""A package's public names loaded on first use (PEP 562 ``__getattr__``).

``import delta_mirror`` must pull in neither SQLAlchemy nor PyArrow, and importing
``delta_mirror.store.states`` (the CLI does, for its option choices) must not import SQLAlchemy:
it is a third of a ``delta-mirror status`` (issue 15). Both packages re-export their names this way.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, public: Mapping[str, str], *, submodules: bool = False) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: a name of ``public`` (name -> the module defining it) is
    imported on first use and kept in the package; with ``submodules``, another name is tried as a
    submodule not imported yet (``package.name``) before ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        module = public.get(name)
        if module is None:
            if submodules:
                try:
                    return importlib.import_module(f"{package}.{name}")
                except ModuleNotFoundError as exc:
                    if exc.name != f"{package}.{name}":
                        raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


__all__ = ["lazy_names"]
