"""The Delta protocol model: names, rules and files of ``_delta_log/`` (no SQL; I/O only through
an ``ObjectStore``).

Import the topic modules directly (``delta_mirror.delta.protocol``, ``.actions``, ``.log_path``,
``.log_listing``, ``.last_checkpoint``, ``.source_log``, ``.checkpoint``); this package re-exports
nothing, so ``delta_mirror.storage`` can use ``log_path`` without loading the listing that uses it.
"""

__all__: list[str] = []
