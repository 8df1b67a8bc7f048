"""The parse process (``delta.parse_process``): a child interpreter parses large commits and the
import gets exactly what parsing in process gives: lines, facts, file digest, the chunks handed on
while parsing, and the same refusal, word for word; a child that is lost changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from support import builders

from delta_mirror.delta import commit_lines, parse_process
from delta_mirror.delta.actions import render_commit
from delta_mirror.delta.commit_lines import read_commit
from delta_mirror.delta.log_listing import list_log
from delta_mirror.delta.parse_process import ParseProcess, digest
from delta_mirror.delta.source_log import iter_commits
from delta_mirror.errors import DataError, TransientError
from delta_mirror.storage import open_store

Chunk = tuple[int, list[str], list[str], list[Any]]


def _commit(n: int, *, seed: int = 0) -> bytes:
    """A commit of ``n`` lines with what canonical re-encoding has to get right: key order,
    escapes, non-ASCII, U+2028 inside a string, spaces after separators, unknown keys."""
    head = [
        '{"commitInfo": {"timestamp": 1700000000000, "inCommitTimestamp": 1700000000001, "z": 1, "a": 2}}',
        '{"futureAction":{"k":[1,{"b":null}]}}',
    ]
    adds = [
        json.dumps(
            {
                "add": builders.add_body(
                    f'p=\u00e9{seed}/f\u2028{i}\t"q".parquet', size=i + 1, stats='{"n":1}'
                )
            },
            ensure_ascii=i % 2 == 0,
        )
        for i in range(n - 4)
    ]
    tail = [
        '{"remove":{"path":"old.parquet","deletionTimestamp":5,"dataChange":true}}',
        '{"txn":{"appId":"a","version":3},"x_unknown":1}',
    ]
    return ("\n".join(head + adds + tail) + "\n").encode()


def _in_process(data: bytes, version: int) -> tuple[list[str], Any, list[Chunk]]:
    seen: list[Chunk] = []
    lines, facts = read_commit(data, table="t", version=version, on_lines=lambda *c: seen.append(c))
    return lines, facts, seen


def _collector() -> tuple[list[Chunk], Any]:
    seen: list[Chunk] = []
    return seen, lambda *chunk: seen.append(chunk)


@pytest.fixture
def child() -> Any:
    parser = ParseProcess.start()
    assert parser is not None, "a child interpreter starts on this machine"
    yield parser
    parser.close()


def test_the_child_answers_what_parsing_here_gives(
    child: ParseProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commit_lines, "LINES_CHUNK", 3)
    commits = {1: _commit(11, seed=1), 2: _commit(4, seed=2), 3: _commit(30, seed=3)}
    for version, data in commits.items():
        child.submit(version, data, table="t")
    for version, data in commits.items():
        seen, on_lines = _collector()
        lines, facts, file, rendered = child.result(version, data, table="t", on_lines=on_lines)
        want_lines, want_facts, want_seen = _in_process(data, version)
        assert (lines, facts, seen) == (want_lines, want_facts, want_seen)
        assert rendered == digest(render_commit(want_lines))  # as the store will render it
        assert file == digest(data) == (hashlib.sha256(data).hexdigest(), len(data))
        assert facts.in_commit_timestamp == 1700000000001 and len(facts.files) == len(data.splitlines()) - 3
    assert child.alive


def test_a_refused_commit_raises_this_process_error_and_the_child_goes_on(child: ParseProcess) -> None:
    bad = _commit(6) + b'{"add": {"path": "x", "size": true}}\n'
    good = _commit(5, seed=9)
    child.submit(4, bad, table="t")
    child.submit(5, good, table="t")
    with pytest.raises(DataError) as got:
        child.result(4, bad, table="t", on_lines=None)
    with pytest.raises(DataError) as want:
        read_commit(bad, table="t", version=4)
    assert str(got.value) == str(want.value) and "line 7" in str(got.value)
    assert child.result(5, good, table="t", on_lines=None)[0] == read_commit(good, table="t", version=5)[0]
    assert child.alive


def test_a_child_lost_mid_commit_hands_each_chunk_on_once(
    child: ParseProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after its first chunk arrived, with more answers than the pipe holds: the chunks
    still in the pipe are read, the rest parsed here from where they stopped."""
    monkeypatch.setattr(commit_lines, "LINES_CHUNK", 500)
    data = _commit(20_000)
    child.submit(7, data, table="t")
    seen: list[Chunk] = []

    def on_lines(seq: int, kinds: list[str], lines: list[str], files: list[Any]) -> None:
        if not seen:
            os.kill(child._proc.pid, signal.SIGKILL)
        seen.append((seq, kinds, lines, files))

    lines, facts, file, rendered = child.result(7, data, table="t", on_lines=on_lines)
    want_lines, want_facts, want_seen = _in_process(data, 7)
    assert (lines, facts, file, rendered) == (want_lines, want_facts, digest(data), None)
    assert [c[0] for c in seen] == [c[0] for c in want_seen] == list(range(0, 20_000 - 499, 500))
    assert seen == want_seen
    assert not child.alive
    child.submit(8, data, table="t")  # ignored: a lost child parses nothing more
    assert child.result(8, data, table="t", on_lines=None)[0] == want_lines


def test_no_interpreter_means_parsing_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    assert ParseProcess.start() is None


def test_a_child_that_is_not_python_is_lost_at_once_and_nothing_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")
    parser = ParseProcess.start()
    assert parser is not None
    data = _commit(8)
    parser.submit(1, data, table="t")
    assert parser.result(1, data, table="t", on_lines=None)[0] == read_commit(data, table="t", version=1)[0]
    assert not parser.alive
    parser.close()


def test_close_leaves_no_process_and_no_file(child: ParseProcess) -> None:
    folder = Path(child._dir)
    child.submit(1, _commit(5), table="t")
    assert folder.is_dir()
    child.close()
    assert child._proc.returncode is not None
    assert not folder.exists()
    child.close()  # twice is harmless


# ------------------------------------------------------------------------------------------------
# iter_commits with a parser


def _log(root: Path, sizes: list[int]) -> None:
    builders.write_commit(root, 0, [builders.PROTOCOL, builders.METADATA])
    for version, n in enumerate(sizes, start=1):
        (root / "_delta_log" / f"{version:020d}.json").write_bytes(_commit(n, seed=version))


def _read_all(root: Path, parser: ParseProcess | None) -> list[tuple[Any, ...]]:
    store = open_store(str(root))
    listing = list_log(store)
    chunks: list[tuple[Any, ...]] = []
    out: list[tuple[Any, ...]] = []
    for c in iter_commits(
        store,
        listing,
        0,
        max(listing.commits),
        table="t",
        on_lines=lambda *a: chunks.append(a),
        parser=parser,
    ):
        out.append((c.version, c.lines, c.facts, c.file))
    return [*out, ("chunks", chunks)]


def test_iter_commits_with_a_parser_yields_what_it_yields_without(
    tmp_path: Path, child: ParseProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large and small commits interleaved: the large ones go to the child, up to AHEAD at a time."""
    monkeypatch.setattr(commit_lines, "LINES_CHUNK", 7)
    _log(tmp_path, [40, 5, 30, 30, 6, 50, 4])
    monkeypatch.setattr(parse_process, "CHILD_MIN_BYTES", len(_commit(20)))
    events: list[tuple[str, int]] = []
    submit, result = child.submit, child.result

    def submitted(version: int, data: bytes, **kwargs: Any) -> None:
        events.append(("submit", version))
        submit(version, data, **kwargs)

    def answered(version: int, data: bytes, **kwargs: Any) -> Any:
        events.append(("result", version))
        return result(version, data, **kwargs)

    monkeypatch.setattr(child, "submit", submitted)
    monkeypatch.setattr(child, "result", answered)
    assert _read_all(tmp_path, child) == _read_all(tmp_path, None)
    # Two large commits with the child before the first answer is read; one more per answer.
    assert events == [
        ("submit", 1),
        ("submit", 3),
        ("result", 1),
        ("submit", 4),
        ("result", 3),
        ("submit", 6),
        ("result", 4),
        ("result", 6),
    ]


def test_a_commit_that_disappears_is_reported_in_its_turn(
    tmp_path: Path, child: ParseProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    _log(tmp_path, [30, 30, 30])
    monkeypatch.setattr(parse_process, "CHILD_MIN_BYTES", 0)
    store = open_store(str(tmp_path))
    listing = list_log(store)
    (tmp_path / "_delta_log" / f"{2:020d}.json").unlink()
    got: list[int] = []
    with pytest.raises(TransientError, match="disappeared"):
        for c in iter_commits(store, listing, 0, 3, table="t", parser=child):
            got.append(c.version)
    assert got == [0, 1]


def test_chunks_carry_their_adds_only_when_the_commit_holds_no_remove(
    child: ParseProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store may index a version's adds before its end only when no remove can come first:
    the chunks of an adds-only commit carry their file actions; any ``"remove"``, or a ``\\u``
    escape that could spell one, and they carry none."""
    monkeypatch.setattr(commit_lines, "LINES_CHUNK", 4)
    adds = "".join(builders.log_line(builders.add(f"f{i}.parquet")) + "\n" for i in range(10))
    with_remove = adds + builders.log_line(builders.remove("f0.parquet")) + "\n"
    escaped = adds + '{"add":{"path":"\\u00e9.parquet","size":1}}\n'
    for text, carried in [(adds, True), (with_remove, False), (escaped, False)]:
        data = text.encode()
        child.submit(1, data, table="t")
        seen, on_lines = _collector()
        _lines, facts, _file, _rendered = child.result(1, data, table="t", on_lines=on_lines)
        assert seen == _in_process(data, 1)[2]
        chunk_files = [f for chunk in seen for f in chunk[3]]
        assert chunk_files == (facts.files[:8] if carried else []), text[-40:]


@pytest.mark.parametrize("gap", ["", "\n", "\n  \t\n", "\n\x1c\n"])
def test_canonical_runs_taken_from_the_parents_bytes_give_what_parsing_here_gives(
    child: ParseProcess, monkeypatch: pytest.MonkeyPatch, gap: str
) -> None:
    """Runs of lines canonical already come back as None and are taken from this process's bytes:
    with blank or space-only lines between them, a chunk of non-canonical lines among them, and
    the commit's tail canonical too."""
    monkeypatch.setattr(commit_lines, "LINES_CHUNK", 4)
    canonical = [
        json.dumps({"add": builders.add_body(f"p/f{i}.parquet", size=i + 1)}, separators=(",", ":"))
        for i in range(17)
    ]
    lines = [*canonical[:9], '{"add": {"path": "spaced.parquet", "size": 1}}', *canonical[9:]]
    data = (lines[0] + "\n" + gap.join(line + "\n" for line in lines[1:])).encode()
    child.submit(1, data, table="t")
    seen, on_lines = _collector()
    got_lines, facts, _file, _rendered = child.result(1, data, table="t", on_lines=on_lines)
    assert (got_lines, facts, seen) == _in_process(data, 1)
    assert child.alive
