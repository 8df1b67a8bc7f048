"""Build Delta checkpoint files (classic, multi-part, V2 with sidecars) from a table snapshot.

Pure functions: the caller hands in the reconciled state of one version (the SQL store computes it
in O(active files)) and gets back file names and bytes; the publisher writes them. Nothing here
touches storage or SQL.

Why it looks the way it does:

* The Parquet schema is Delta-Spark's, with every field nullable (delta-rs #4247, trino #18760);
  Parquet map keys stay ``required`` because the Parquet spec demands it (Spark writes them so).
  Readers look columns up by name, so field order only matters for humans diffing files.
* ``add``/``remove`` lines are parsed with Arrow's JSON reader in bounded chunks instead of one
  Python dict per action: a 300k-file table is checkpointed faster and in less memory than
  deltalake's own ``create_checkpoint``. Chunks the fast path cannot take (inconsistent types,
  odd fields) fall back to ``json.loads`` per line, which also produces the precise error.
* Like Spark, ``dataChange`` is written as ``false`` (a checkpoint changes no data), unknown
  fields are dropped (the schema is fixed), ``remove`` carries no ``stats``/``tags``, and
  ``commitInfo``/``cdc`` are never written.
* ``stats`` is always kept as the JSON string, even when ``delta.checkpoint.writeStatsAsJson`` is
  ``false`` (every reader accepts it); ``stats_parsed``/``partitionValues_parsed``
  (``delta.checkpoint.writeStatsAsStruct``) are not written: they are optional for readers.
* Multi-part checkpoints are clustered with Spark's hash partitioning of ``add.path`` /
  ``remove.path`` (Murmur3, seed 42, pmod), as PROTOCOL.md requires, so our parts agree with
  Delta-Spark's if both ever write the same version with the same number of parts.
* V2 (UUID-named) names come from uuid5 of the checkpoint id and the file's SHA-256: a re-run
  produces the same names and bytes, and different bytes can never collide with an existing name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from delta_mirror.lazy import lazy_names

# public name -> the module that defines it. Loaded on first use: importing the package (or its
# ``model``) must not load pyarrow, so the local engine sends the store's read of the active files
# first and imports Arrow and the layouts while the server joins them (issue 31: done the other
# way round, the 0.1 s of Arrow imports came before the read).
_PUBLIC = {
    "CHECKPOINT_SCHEMA": "delta_mirror.delta.checkpoint.schema",
    "SIDECAR_SCHEMA": "delta_mirror.delta.checkpoint.schema",
    "V2_CHECKPOINT_SCHEMA": "delta_mirror.delta.checkpoint.schema",
    "CheckpointFile": "delta_mirror.delta.checkpoint.model",
    "CheckpointHeader": "delta_mirror.delta.checkpoint.layouts",
    "CheckpointInput": "delta_mirror.delta.checkpoint.model",
    "CheckpointResult": "delta_mirror.delta.checkpoint.model",
    "build_checkpoint": "delta_mirror.delta.checkpoint.layouts",
    "checkpoint_header": "delta_mirror.delta.checkpoint.layouts",
    "checkpoint_result": "delta_mirror.delta.checkpoint.layouts",
    "non_file_parquet": "delta_mirror.delta.checkpoint.layouts",
    "num_checkpoint_parts": "delta_mirror.delta.checkpoint.layouts",
    "spark_hash_partition": "delta_mirror.delta.checkpoint.spark_hash",
    "v2_checkpoint_files": "delta_mirror.delta.checkpoint.layouts",
}

if TYPE_CHECKING:
    from delta_mirror.delta.checkpoint.layouts import (
        CheckpointHeader,
        build_checkpoint,
        checkpoint_header,
        checkpoint_result,
        non_file_parquet,
        num_checkpoint_parts,
        v2_checkpoint_files,
    )
    from delta_mirror.delta.checkpoint.model import CheckpointFile, CheckpointInput, CheckpointResult
    from delta_mirror.delta.checkpoint.schema import CHECKPOINT_SCHEMA, SIDECAR_SCHEMA, V2_CHECKPOINT_SCHEMA
    from delta_mirror.delta.checkpoint.spark_hash import spark_hash_partition

# a submodule not imported yet (``file_actions``, ...) is found too, as before this was lazy
__getattr__ = lazy_names(__name__, _PUBLIC, submodules=True)

__all__ = [
    "CHECKPOINT_SCHEMA",
    "SIDECAR_SCHEMA",
    "V2_CHECKPOINT_SCHEMA",
    "CheckpointFile",
    "CheckpointHeader",
    "CheckpointInput",
    "CheckpointResult",
    "build_checkpoint",
    "checkpoint_header",
    "checkpoint_result",
    "non_file_parquet",
    "num_checkpoint_parts",
    "spark_hash_partition",
    "v2_checkpoint_files",
]
