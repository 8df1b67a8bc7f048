"""Large JSON commits parsed in a child process while this one stores what is parsed.

Parsing a commit (``commit_lines.read_commit``) is pure Python under the GIL: about a second per
100,000 lines, the largest share of an import's own CPU. A child process parses the large commits
(``CHILD_MIN_BYTES`` and up) on the other core and hands back, in order, each chunk of canonical
lines as it is parsed, then the commit's facts and the file's SHA-256; the import's writer thread
and the database work meanwhile. Small commits are parsed in process: a process and a pickle per
commit would cost more than they save.

The child changes no outcome. It runs the same ``read_commit``; when it refuses a commit, the
commit is parsed again here, so the error raised is the in-process one, word for word. When the
child cannot start or ends early, every commit it has not answered is parsed here (chunks already
handed on are not handed on twice). The child is a fresh interpreter (``sys.executable``, not a
fork of an Airflow worker) that only imports this module; it ends when its stdin closes, so a
killed import does not leave it behind.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from delta_mirror.delta import commit_lines
from delta_mirror.delta.actions import render_commit
from delta_mirror.delta.line_facts import FileAction, LineFacts

log = logging.getLogger(__name__)

# Commits of this many bytes and more go to the child (a 100,000-line commit is ~15 MB; a
# 5,000-commit history's commits are ~10 KB each and stay here).
CHILD_MIN_BYTES = 1 << 20
# Large commits sent ahead of the one being read back: the child parses the next while this
# process stores the current one.
AHEAD = 2
PIPE_BYTES = 1 << 20  # Linux's default /proc/sys/fs/pipe-max-size
CLOSE_TIMEOUT = 10.0  # seconds the child gets to exit once its stdin is closed

_HEAD = struct.Struct("<Q")
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); from delta_mirror.delta.parse_process import serve; serve()"
)

FileDigest = tuple[str, int]  # (SHA-256 hex, size) of a commit file
OnLines = Callable[[int, list[str], list[str], list[FileAction]], None]


def _send(stream: IO[bytes], message: object) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEAD.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _recv(stream: IO[bytes]) -> Any:
    head = stream.read(_HEAD.size)
    if len(head) < _HEAD.size:
        raise EOFError("the parse process closed its output")
    (size,) = _HEAD.unpack(head)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError("the parse process closed its output mid-message")
    return pickle.loads(payload)


def _widen(stream: IO[bytes] | None) -> None:
    """A pipe of ``PIPE_BYTES`` where Linux allows it: each wait for the other side costs a GIL
    hand-over (up to the 5 ms switch interval while another thread runs Python), so a 15 MB commit
    through the default 64 KiB pipe would wait hundreds of times."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if stream is not None and setsize is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(stream.fileno(), setsize, PIPE_BYTES)


def digest(data: bytes) -> FileDigest:
    """A commit file's (SHA-256, size), as the store records a published file."""
    return hashlib.sha256(data).hexdigest(), len(data)


class ParseProcess:
    """A child process running ``read_commit``; requests are answered in the order sent."""

    def __init__(self, proc: subprocess.Popen[bytes], folder: str) -> None:
        self._proc = proc
        self._dir = folder
        self._in: IO[bytes] | None = proc.stdin
        self._out: IO[bytes] | None = proc.stdout
        self.alive = True

    @classmethod
    def start(cls) -> ParseProcess | None:
        """The child, or None where no interpreter can be started (everything is then parsed in
        process)."""
        root = str(Path(__file__).resolve().parents[2])
        shm = "/dev/shm"
        try:
            folder = tempfile.mkdtemp(prefix="dm-parse-", dir=shm if os.access(shm, os.W_OK) else None)
        except OSError as exc:
            log.info("parsing in this process: no folder for the parse process (%s)", exc)
            return None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, root],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except (OSError, ValueError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            log.info("parsing in this process: no parse process could start (%s)", exc)
            return None
        _widen(proc.stdout)
        return cls(proc, folder)

    def submit(self, version: int, data: bytes, *, table: str) -> None:
        """Ask for ``version``'s parse (answered by ``result``, in submission order). The bytes go
        through a file in a private folder (on ``/dev/shm`` where there is one), the request
        through the pipe: a write that never waits for the child, and one read there."""
        if self.alive and self._in is not None:
            path = os.path.join(self._dir, str(version))
            try:
                with open(path, "wb") as f:
                    f.write(data)
                _send(self._in, (version, table, commit_lines.LINES_CHUNK, path))
            except (OSError, ValueError) as exc:
                self._lost(exc)

    def result(
        self, version: int, data: bytes, *, table: str, on_lines: OnLines | None
    ) -> tuple[list[str], LineFacts, FileDigest, FileDigest | None]:
        """``read_commit(data)``, ``digest(data)`` and the digest of the canonical rendering of
        the lines (``render_commit``; None when parsed here) for the submitted ``version``, with
        ``on_lines`` called for each chunk as the child parses it. A refusal is raised by parsing
        here; so is every commit after the child is lost."""
        chunks: list[list[str]] = []
        facts = LineFacts()
        handed = 0  # lines already given to on_lines
        source = _SourceLines(data)
        while self.alive and self._out is not None:
            try:
                kind, got, *rest = _recv(self._out)
            except (EOFError, OSError, pickle.UnpicklingError, ValueError) as exc:
                self._lost(exc)
                break
            if got != version:
                self._lost(RuntimeError(f"answer for version {got} while waiting for {version}"))
                break
            if kind == "lines":
                seq, kinds, lines, files = rest
                if lines is None:  # canonical already: the source's own lines
                    lines = source.lines(seq, len(kinds))
                chunks.append(lines)
                facts.kinds += kinds
                facts.files += files
                if on_lines is not None:
                    on_lines(seq, kinds, lines, files)
                handed = seq + len(lines)
            elif kind == "commit":
                tail, kinds, files, facts.in_commit_timestamp, file, rendered = rest
                if tail is None:
                    tail = source.lines(handed, len(kinds))
                chunks.append(tail)
                facts.kinds += kinds
                facts.files += files
                return [line for chunk in chunks for line in chunk], facts, file, rendered
            else:  # "refused": parse here, to raise the error as this process words it
                break

        def unseen(seq: int, kinds: list[str], lines: list[str], files: list[FileAction]) -> None:
            if on_lines is not None and seq >= handed:
                on_lines(seq, kinds, lines, files)

        lines, facts = commit_lines.read_commit(data, table=table, version=version, on_lines=unseen)
        return lines, facts, digest(data), None

    def _lost(self, exc: BaseException) -> None:
        log.warning("the parse process ended (%s); parsing the rest in this process", exc)
        self.alive = False
        self.close()

    def close(self) -> None:
        """Close its stdin (it exits on EOF) and wait; kill it if it lingers."""
        self.alive = False
        for stream in (self._in, self._out):
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.close()
        self._in = self._out = None
        try:
            self._proc.wait(timeout=CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> ParseProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------------------
# The child


def serve() -> None:
    """The child's loop: a request from stdin (a tiny message: the parent never waits to write
    one), the bytes from its file, the answers on the original stdout; ends on EOF."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by accident goes to stderr, not into the answers
    gc.disable()  # parsed JSON holds no cycles (as in the import itself)
    requests = sys.stdin.buffer
    while True:
        try:
            version, table, chunk, path = _recv(requests)
        except EOFError:
            return
        with open(path, "rb") as f:
            data = f.read()
        os.unlink(path)
        _answer(out, version, table, chunk, data)


def _answer(out: IO[bytes], version: int, table: str, chunk: int, data: bytes) -> None:
    """``read_commit``'s chunks and result, each sent as parsed. A run of lines that are canonical
    already (the source's own text, as Delta writers write it) goes as None: the parent has the
    same bytes and takes the lines from them (``_SourceLines``), so the lines, most of a commit's
    bytes, are neither pickled here nor unpickled there. The facts go once, chunk by chunk."""
    sent = files_sent = 0
    source = _SourceLines(data)

    def on_lines(seq: int, kinds: list[str], lines: list[str], files: list[FileAction]) -> None:
        nonlocal sent, files_sent
        same = source.lines(seq, len(lines)) == lines
        _send(out, ("lines", version, seq, kinds, None if same else lines, files))
        sent, files_sent = seq + len(lines), files_sent + len(files)

    commit_lines.LINES_CHUNK = chunk  # the parent's, so chunks fall where they would there
    try:
        lines, facts = commit_lines.read_commit(data, table=table, version=version, on_lines=on_lines)
    except Exception:  # the parent parses it again and raises its own error
        _send(out, ("refused", version))
        return
    tail = lines[sent:]
    # The store records the digest of the canonical rendering: taken here, off the import's path.
    _send(
        out,
        (
            "commit",
            version,
            None if source.lines(sent, len(tail)) == tail else tail,
            facts.kinds[sent:],
            facts.files[files_sent:],
            facts.in_commit_timestamp,
            digest(data),
            digest(render_commit(lines)),
        ),
    )


class _SourceLines:
    """A commit's non-blank lines as its bytes hold them (split on ``\n`` only, as
    ``read_commit`` splits), taken once when first asked for: the n-th is the text the n-th
    canonical line came from, and equal to it when the writer wrote canonical JSON."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._lines: list[str] | None = None

    def lines(self, seq: int, count: int) -> list[str]:
        if self._lines is None:
            text = self._data.decode("utf-8")
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()
            # Every line opens an object (the usual log): none is blank, no filter to run.
            if not (text.startswith("{") and text.count("\n{") == len(lines) - 1):
                lines = [line for line in lines if line and not line.isspace()]
            self._lines = lines
        return self._lines[seq : seq + count]


__all__ = ["AHEAD", "CHILD_MIN_BYTES", "ParseProcess", "digest", "serve"]
