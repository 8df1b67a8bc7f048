"""``python -m delta_mirror.cli``: the same command as the ``delta-mirror`` script."""

from __future__ import annotations

from delta_mirror.cli import main

if __name__ == "__main__":
    main()

__all__: list[str] = []
