"""Telling a reader's limitation from a mirror problem.

A reader that fails on a version is not proof that the published table is wrong. Two kinds of
failure are the reader's own, and validation reports them as limitations, not problems:

- **a feature the reader does not implement** — its error says so (``Unsupported table features
  required: [VariantShreddingPreview]``, ``... reader features ... not yet supported``);
- **deletion vectors it cannot load although every file is there** — checked by looking for each
  deletion-vector file itself in storage, at the path the protocol derives from the descriptor
  (storage type ``u``: ``<random prefix><z85 UUID>`` → ``<prefix>/deletion_vector_<uuid>.bin``).
  A reader that looks elsewhere (e.g. ignores the prefix) has a defect; a file that is really
  absent is a mirror problem and is named.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import unquote

from delta_mirror.jobs.validate.report import Limitation, Problem, ReaderFacts

_UNSUPPORTED = re.compile(
    r"unsupported (table )?feature|not (yet )?supported|unsupported reader feature|"
    r"unsupported table features|feature .* is not supported|not implemented",
    re.IGNORECASE,
)
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
_UUID_CHARS = 20  # a z85-encoded UUID is 20 characters; anything before it is the random prefix


def z85_decode(text: str) -> bytes:
    """Z85 (ZeroMQ's base85) text to bytes; ``ValueError`` when it is not Z85."""
    if len(text) % 5:
        raise ValueError(f"z85 text must be a multiple of 5 characters, found {len(text)}")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i : i + 5]:
            if c not in _Z85_VALUE:
                raise ValueError(f"{c!r} is not a z85 character")
            value = value * 85 + _Z85_VALUE[c]
        if value >= 1 << 32:
            raise ValueError("z85 group out of range")
        out += value.to_bytes(4, "big")
    return bytes(out)


def dv_file_path(dv: Mapping[str, Any]) -> str | None:
    """Where a deletion vector's file is (relative to the table root, or absolute), per PROTOCOL.md.

    ``None`` for an inline DV (no file). Raises ``ValueError`` for a descriptor that names no path.
    """
    kind, text = dv.get("storageType"), str(dv.get("pathOrInlineDv") or "")
    if kind == "i":
        return None
    if kind == "p":
        return unquote(text)
    if kind != "u" or len(text) < _UUID_CHARS:
        raise ValueError(f"deletion vector descriptor {dict(dv)!r} names no file")
    prefix, encoded = text[:-_UUID_CHARS], text[-_UUID_CHARS:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return f"{prefix}/{name}" if prefix else name


def unsupported_feature(reader: ReaderFacts, version: int | None, error: str) -> Limitation | None:
    """A limitation when the reader's own error says it does not implement something.

    ``reader``: one of ``readers.READERS`` (its name and the reader to use instead).
    """
    if not _UNSUPPORTED.search(error):
        return None
    return Limitation(
        reader.name,
        version,
        f"{reader.name} does not implement a feature this table uses: {error}",
        reader.use_instead,
    )


def judge_dv_failure(
    reader: ReaderFacts,
    version: int,
    error: str,
    dvs: Iterable[tuple[str, Mapping[str, Any]]],
    exists: Callable[[str], bool],
) -> Limitation | Problem:
    """A reader failed on the deletion vectors of ``version``: limitation or problem?

    ``dvs``: (data file path, descriptor) of the version's active files with a DV, from the store.
    ``exists``: whether a path (relative to the table root, or absolute) is in storage.
    """
    name = reader.name
    missing: list[tuple[str, str]] = []
    prefixed = checked = 0
    for data_path, dv in dvs:
        try:
            path = dv_file_path(dv)
        except ValueError as exc:
            missing.append((data_path, str(exc)))
            continue
        if path is None:
            continue
        if dv.get("storageType") == "u" and "/" in path:
            prefixed += 1
        checked += 1
        if not exists(path):
            missing.append((data_path, path))
    if not checked and not missing:
        return Problem(
            "reader_error",
            version,
            f"at version {version}: {name} cannot read the deletion vectors (the version has no "
            f"deletion vector file): {error}",
            "an inline deletion vector or the protocol's deletionVectors feature confuses the reader; "
            "check the deletionVector fields of the version's adds, and compare with --reader spark",
        )
    if missing:
        data_path, path = missing[0]
        return Problem(
            "missing_deletion_vector",
            version,
            f"at version {version}: {len(missing)} deletion vector file(s) named by the log are not in "
            f"storage (e.g. {path}, the deletion vector of {data_path}); {name}: {error}",
            "a deletion vector file is data written by the table's writer (the mirror never writes it); "
            "restore it from a backup, or check the deletionVector of that add",
        )
    why = (
        f"{prefixed} of them stored with a random path prefix (storage type 'u'), which {name} "
        "does not resolve"
        if prefixed
        else f"{name} fails on them"
    )
    return Limitation(
        name,
        version,
        f"at version {version}: {name} cannot read the deletion vectors although every deletion "
        f"vector file the log names is in storage ({why}): {error}",
        reader.use_instead,
    )


__all__ = ["dv_file_path", "judge_dv_failure", "unsupported_feature", "z85_decode"]
