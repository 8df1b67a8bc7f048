"""delta-mirror: a SQL database is the authority for Delta logs; the mirror publishes them.

The core library (this package, minus ``delta_mirror.airflow``) never imports Airflow.
"""

from __future__ import annotations

__version__ = "0.1.0"
ENGINE_INFO = f"delta-mirror/{__version__}"

__all__ = ["ENGINE_INFO", "__version__"]
