"""The one log replay: a table's state as a Delta reader reconstructs it from the log's actions.

PROTOCOL.md, "Action Reconciliation": the state at a version is the latest ``protocol`` and
``metaData`` seen, the latest ``txn`` seen per ``appId``, the latest ``domainMetadata`` seen per
domain (one with ``removed: true`` is a tombstone: the domain is gone), and the active files,
each a logical file keyed by its path and deletion vector id (:class:`FileKey`); ``commitInfo``
takes no part. Within one commit the removes apply to the state before it, then the adds, so a
commit that removes and re-adds a key leaves it active.

Every replay of the package is this one: import compares the JSON commits with a source
checkpoint (``delta.source_state.ReplayState``), validation walks the store's view version by
version (``jobs.validate.reader_view.StoreState``), and the commit rules and the bulk load's file
index key files by the same :class:`FileKey` (``delta.commit_rules``, ``store.bulk_load``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

from delta_mirror.delta.actions import dv_id, line_action


class FileKey(NamedTuple):
    """A logical file's identity: the action's ``path`` (its own value, as the store indexes it)
    and the unique id of its deletion vector ('' without one)."""

    path: str
    dv_id: str


def file_key(body: Mapping[str, Any]) -> FileKey:
    """The key of an ``add`` or ``remove`` action (its body)."""
    dv = body.get("deletionVector")
    return FileKey(body.get("path", ""), dv_id(dv) if dv else "")


#: What a replay keeps of each active file (its add line, a store entry, ...).
F = TypeVar("F")


class LogReplay(Generic[F]):
    """Protocol, metaData, transactions (appId -> ``txn``), domain metadata (domain ->
    ``domainMetadata``, removed ones dropped) and the active files (:class:`FileKey` -> what
    :meth:`_file` keeps of the add), commit by commit.

    A subclass says what it keeps of a file (:meth:`_file`) and may follow files leaving the
    state (:meth:`_removed`); the rules themselves live here only.
    """

    def __init__(self) -> None:
        self.protocol: dict[str, Any] | None = None
        self.metadata: dict[str, Any] | None = None
        self.txns: dict[str, dict[str, Any]] = {}
        self.domains: dict[str, dict[str, Any]] = {}
        self.files: dict[FileKey, F] = {}

    def apply(self, lines: Iterable[str]) -> None:
        """One commit's lines (a checkpoint's lines are replayed as one commit).

        The adds go in as they come and the removes at the end, skipping the keys the commit
        added: the state the rule gives (removes first), without holding the commit's adds."""
        files, make = self.files, self._file
        added: list[FileKey] = []
        removes: list[FileKey] = []
        for line in lines:
            if line.startswith('{"commitInfo":'):
                continue  # one known action per line: this one is commitInfo
            kind, body = line_action(json.loads(line))
            if not isinstance(body, dict):
                continue
            if kind == "add":
                dv = body.get("deletionVector")
                key = FileKey(body.get("path", ""), dv_id(dv) if dv else "")  # file_key, inlined
                files[key] = make(key, body, line)
                added.append(key)
            elif kind == "remove":
                removes.append(file_key(body))
            else:
                self.action(kind, body)
        if removes:
            self.remove(removes, skip=set(added))

    def remove(self, keys: Iterable[FileKey], *, skip: Collection[FileKey] = ()) -> None:
        """Remove ``keys`` from the active files (those in ``skip``, re-added by the same commit, stay)."""
        files = self.files
        for key in keys:
            if key not in skip:
                files.pop(key, None)
                self._removed(key)

    def action(self, kind: str, body: dict[str, Any]) -> None:
        """A non-file action: the latest protocol, metaData, txn per appId, domain wins."""
        if kind == "protocol":
            self.protocol = body
        elif kind == "metaData":
            self.metadata = body
        elif kind == "txn":
            self.txns[str(body.get("appId"))] = body
        elif kind == "domainMetadata":
            name = str(body.get("domain"))
            if body.get("removed") is True:
                self.domains.pop(name, None)
            else:
                self.domains[name] = body

    def _file(self, key: FileKey, add: dict[str, Any], line: str) -> F:
        """What the state keeps of an active file (its add's body and line)."""
        raise NotImplementedError

    def _removed(self, key: FileKey) -> None:
        """A remove of ``key`` applied (whether or not the key was active)."""


__all__ = ["FileKey", "LogReplay", "file_key"]
