"""Development aids: the demo behind ``make demo`` and sample data files for local tables.

Nothing in the mirror itself depends on this package.
"""

__all__: list[str] = []
