"""Parsing the package's source for the shape tests (import graph, reviewed SQL sites).

CPython 3.11 (before 3.11.8, gh-106905) can raise ``SystemError: AST constructor recursion depth
mismatch`` from ``ast.parse`` when a garbage collection runs Python finalizers in the middle of
building the tree — which a long test session full of pooled connections does. Collection is
paused while a file is parsed, so the tree is built without interruption.
"""

from __future__ import annotations

import ast
import gc
from pathlib import Path


def parse_source(path: Path) -> ast.Module:
    """``ast.parse`` of ``path`` with garbage collection paused (see the module docstring)."""
    text = path.read_text(encoding="utf-8")
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(text, str(path))
    finally:
        if enabled:
            gc.enable()


__all__ = ["parse_source"]
