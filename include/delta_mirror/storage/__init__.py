"""Object storage, the adapter side of ``delta/object_store.py``'s ``ObjectStore`` port: a table
root opened as a store (``open_store``) that writes only below ``_delta_log/``.

- ``locations.py``: what a table root may be and its one spelling (``normalize_location``).
- ``options.py``: a location's credentials and endpoints from the environment.
- ``obstore_store.py``: the store on obstore, put-if-absent, errors mapped to their classes.

``delta/`` never imports this package (``tests/test_architecture.py``).
"""

from __future__ import annotations

from delta_mirror.delta.object_store import ObjectExistsError, ObjectMeta, ObjectStore
from delta_mirror.storage.locations import (
    AZURE_SCHEMES,
    GCS_SCHEMES,
    S3_SCHEMES,
    local_path,
    normalize_commit_root,
    normalize_location,
)
from delta_mirror.storage.obstore_store import ObstoreStore, open_store
from delta_mirror.storage.options import (
    azure_options_from_env,
    gcs_options_from_env,
    s3_options_from_env,
    storage_options_for,
)

__all__ = [
    "AZURE_SCHEMES",
    "GCS_SCHEMES",
    "S3_SCHEMES",
    "ObjectExistsError",
    "ObjectMeta",
    "ObjectStore",
    "ObstoreStore",
    "azure_options_from_env",
    "gcs_options_from_env",
    "local_path",
    "normalize_commit_root",
    "normalize_location",
    "open_store",
    "s3_options_from_env",
    "storage_options_for",
]
