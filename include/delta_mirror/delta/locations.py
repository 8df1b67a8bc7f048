"""A table root, normalised once: the one form in which locations are stored and compared.

``normalize_table_root`` takes a root as a writer or a user names it (Hadoop's ``file:/x``,
``s3a://b/x``, a local path) and returns the form the store keeps, or refuses it with one line
(``PermanentError``). It is the only normaliser: the commit service's roots, the store's
``create_table`` (so ``delta-mirror commit --location``, ``import`` and every API caller), the
publisher's and readers' ``open_store`` (``storage.normalize_location`` is this function) all go
through it. ``location_key`` is the same normalisation without I/O and without refusing,
for comparing locations already stored (the overlap check): two roots that name the same folder
or prefix have the same key, so ``s3a://lake/w//t`` can never become a second table beside
``s3://lake/w/t``.

Invariants of a normalised root: scheme in lower case, ``s3a``/``s3n`` spelled ``s3``; no empty
segment (``//``), no trailing ``/``; no ``.``/``..`` segment and no segment ending in ``.`` (a
plain local path, without a scheme, may say ``.``/``..``: it is resolved as the shell would); no
control character or NUL (raw or percent-encoded); every segment at most 255 UTF-8 bytes and the
root at most ``MAX_ROOT_CHARS`` characters; object-store paths percent-decoded except ``%``, ``?``
and ``#`` (so ``a%20b`` and ``a b`` are one root); local roots absolute ``file:///`` URIs as
``pathlib`` writes them.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from delta_mirror.errors import PermanentError

#: The longest root accepted, in characters (raw, before normalising).
MAX_ROOT_CHARS = 4096
#: The longest path segment, in UTF-8 bytes (what file systems and object stores allow).
MAX_SEGMENT_BYTES = 255
OBJECT_STORE_SCHEMES = ("s3", "az", "abfs", "abfss", "gs")
_ALIASES = {"s3a": "s3", "s3n": "s3"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HINT = "send the table's root URI, e.g. s3a://bucket/path/to/table or file:/data/table"


def _refuse(root: str, why: str) -> PermanentError:
    shown = root if len(root) <= 80 else root[:80] + "..."
    return PermanentError(f"invalid table root {shown!r}: {why}", hint=_HINT)


def _scheme(root: str) -> tuple[str, str]:
    """The lower-case scheme (aliases resolved) and the rest after ``scheme:``; ``""`` for a path."""
    head, sep, rest = root.partition(":")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", head) or len(head) == 1:
        return "", root  # a local path (a one-letter "scheme" is a Windows drive)
    scheme = head.lower()
    return _ALIASES.get(scheme, scheme), rest


def _segments(path: str) -> list[str]:
    return [s for s in path.split("/") if s]


def _check_segment(root: str, segment: str) -> None:
    if _CONTROL.search(segment):
        raise _refuse(root, "a control character or NUL in it")
    if segment.endswith("."):
        raise _refuse(root, f"the path segment {segment[:40]!r} is '.', '..' or ends in '.'")
    if len(segment.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:
        raise _refuse(root, f"a path segment longer than {MAX_SEGMENT_BYTES} bytes")
    if "\\" in segment:
        raise _refuse(root, "a '\\' in it")


def _decode(root: str, segment: str) -> str:
    try:
        return unquote(segment, errors="strict")
    except UnicodeDecodeError:
        raise _refuse(root, "a percent-encoding that is not UTF-8") from None


def _encode_object_segment(segment: str) -> str:
    """A decoded segment back in the root: only ``%``, ``?`` and ``#`` need encoding there."""
    return segment.replace("%", "%25").replace("?", "%3F").replace("#", "%23")


def normalize_table_root(root: str) -> str:
    """``root`` in the one form the store keeps (see the module's invariants), or ``PermanentError``
    with one line saying what is wrong. Local roots are resolved (symlinks followed), as before."""
    if not isinstance(root, str) or not root:
        raise _refuse(str(root), "empty")
    if len(root) > MAX_ROOT_CHARS:
        raise _refuse(root, f"longer than {MAX_ROOT_CHARS} characters")
    if _CONTROL.search(root):
        raise _refuse(root, "a control character or NUL in it")
    scheme, rest = _scheme(root)
    if scheme in ("", "file"):
        return _local_root(root, scheme, rest)
    if scheme not in OBJECT_STORE_SCHEMES:
        raise PermanentError(
            f"unsupported location scheme {scheme[:20]!r} in the table root",
            hint="use a local path, file:, s3:// (s3a://, s3n://), az://, abfs(s)://, or gs://",
        )
    return _object_root(root, scheme, rest)


def _local_root(root: str, scheme: str, rest: str) -> str:
    path = rest
    if scheme == "file":
        if rest.startswith("//"):
            host, _, path = rest[2:].partition("/")
            if host not in ("", "localhost"):
                raise _refuse(root, f"a file: URI with the host {host[:40]!r}")
            path = "/" + path
        if "?" in path or "#" in path:
            raise _refuse(root, "a '?' or '#' in it")
        path = _decode(root, path)
        if not path.startswith("/"):
            raise _refuse(root, "a file: URI whose path is not absolute")
    for segment in _segments(path):
        if not scheme and segment in (".", ".."):
            continue  # a path on this machine as a shell names it (``../t``): resolved below
        _check_segment(root, segment)
    local = "/" + "/".join(_segments(path)) if path.startswith("/") else path
    try:
        return Path(local).expanduser().resolve().as_uri()
    except (OSError, RuntimeError, ValueError) as exc:
        raise _refuse(root, f"the path cannot be resolved ({type(exc).__name__})") from None


def _object_root(root: str, scheme: str, rest: str) -> str:
    parts = urlsplit(f"{scheme}:{rest}")
    if not parts.netloc or not rest.startswith("//"):
        raise _refuse(root, "no bucket or container")
    if parts.query or parts.fragment or "?" in rest or "#" in rest:
        raise _refuse(root, "a '?' or '#' in it")
    segments = []
    for raw in _segments(parts.path):
        if re.search("%2f", raw, re.IGNORECASE):
            raise _refuse(root, "an encoded '/' (%2F) in a path segment")
        segment = _decode(root, raw)
        _check_segment(root, segment)
        segments.append(_encode_object_segment(segment))
    return f"{scheme}://{parts.netloc}" + "".join(f"/{s}" for s in segments)


def location_key(location: str) -> str:
    """``location`` for comparing with another stored location: the normalisation above without
    I/O and without refusing (aliases, ``//``, trailing ``/`` and percent-encoding folded); two
    locations name the same root exactly when their keys are equal, and one lies under the other
    when its key starts with the other's key plus ``/``."""
    scheme, rest = _scheme(location)
    if scheme == "":
        scheme, rest = "file", location
    if rest.startswith("//"):
        host, _, path = rest[2:].partition("/")
    else:
        host, path = "", rest
    if scheme == "file" and host == "localhost":
        host = ""
    path = unquote(path, errors="replace")
    return f"{scheme}://{host}" + "".join(f"/{s}" for s in _segments(path))


def same_or_nested(a: str, b: str) -> bool:
    """Whether the two locations name the same root or one lies inside the other."""
    ka, kb = location_key(a) + "/", location_key(b) + "/"
    return ka.startswith(kb) or kb.startswith(ka)


__all__ = [
    "MAX_ROOT_CHARS",
    "MAX_SEGMENT_BYTES",
    "OBJECT_STORE_SCHEMES",
    "location_key",
    "normalize_table_root",
    "same_or_nested",
]
