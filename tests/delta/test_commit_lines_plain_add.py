"""``read_commit``'s fast path for canonical plain add lines gives what the full parse gives: the
same stored lines, facts and refusals, for the lines it takes and for every near miss."""

from __future__ import annotations

import random

import pytest

from delta_mirror.delta import commit_lines
from delta_mirror.errors import MirrorError

BASE = (
    '{"add":{"path":"part=a/f-1.parquet","partitionValues":{"part":"a","n":null},"size":1024,'
    '"modificationTime":1700000000000,"dataChange":true,"stats":"{\\"numRecords\\":3,\\"minValues\\":{\\"id\\":0}}"}}'
)

NEAR_MISSES = [
    BASE,
    BASE.replace(',"n":null', ""),
    BASE.replace('{"part":"a","n":null}', "{}"),
    BASE.replace('"stats":"', '"stats":null,"x":"'),
    BASE.replace(',"stats":"{\\"numRecords\\":3,\\"minValues\\":{\\"id\\":0}}"', ""),
    BASE.replace(',"stats":"{\\"numRecords\\":3,\\"minValues\\":{\\"id\\":0}}"', ',"stats":null'),
    BASE.replace("numRecords", "num\\/Records"),  # not canonical: "/" needs no escape
    BASE.replace("numRecords", "num\\u0041Records"),  # not canonical: "A"
    BASE.replace("numRecords", "num\\u001fRecords"),  # canonical
    BASE.replace("numRecords", "num\\u000aRecords"),  # not canonical: \n
    BASE.replace("numRecords", "num\\u001FRecords"),  # not canonical: upper-case hex
    BASE.replace("numRecords", "num\\tRecords"),
    BASE.replace("numRecords", "num\tRecords"),  # a raw tab: refused
    BASE.replace("numRecords", "numé€Records"),
    BASE.replace("f-1", "f\\\\1"),  # an escape in the path
    BASE.replace("f-1", "f-é"),
    BASE.replace('"part":"a"', '"part":"a\\"b"'),
    BASE.replace('"part":"a","n":null', '"part":"a","part":"b"'),  # a repeated key
    BASE.replace('"part":"a","n":null', '"n":null,"part":"a"'),
    BASE.replace('"size":1024', '"size":-0'),
    BASE.replace('"size":1024', '"size":0'),
    BASE.replace('"size":1024', '"size":-5'),
    BASE.replace('"size":1024', '"size":007'),
    BASE.replace('"size":1024', '"size":1.0'),
    BASE.replace('"size":1024', '"size":1e3'),
    BASE.replace('"size":1024', '"size":true'),
    BASE.replace('"size":1024', '"size":"1024"'),
    BASE.replace('"size":1024', '"size":99999999999999999999999'),
    BASE.replace('"modificationTime":1700000000000', '"modificationTime":-0'),
    BASE.replace('"modificationTime":1700000000000', '"modificationTime":-1'),
    BASE.replace('"dataChange":true', '"dataChange":false'),
    BASE.replace('"dataChange":true', '"dataChange":"true"'),
    BASE.replace('"dataChange":true', '"dataChange":true,"tags":{"a":"b"}'),
    BASE.replace('"dataChange":true', '"dataChange":true,"deletionVector":null'),
    BASE.replace('"path":', '"path" :'),
    BASE.replace('{"add":{', '{"add": {'),
    BASE.replace('"path":"part=a/f-1.parquet",', "") + "",
    BASE.replace('"partitionValues":{"part":"a","n":null},', ""),
    BASE + " ",
    " " + BASE,
    BASE + "\r",
    BASE[:-1],
    BASE + "}",
    BASE.replace('{"add":', '{"add":{"path":"x"},"remove":').replace("}}", "}}", 1),
]


def _both(data: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    def run() -> object:
        try:
            return commit_lines.read_commit(data, table="t", version=3)
        except MirrorError as exc:
            return (type(exc).__name__, str(exc))

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(commit_lines, "_PLAIN_ADD", lambda line: None)
        slow = run()
    return fast, slow


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_a_line_gives_what_the_full_parse_gives(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = ('{"commitInfo":{"timestamp":1}}\n' + line + "\n" + BASE + "\n").encode()
    fast, slow = _both(data, monkeypatch)
    assert fast == slow


def test_the_fast_path_takes_the_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    real = commit_lines._PLAIN_ADD

    def spy(line: str) -> object:
        match = real(line)
        if match is not None:
            taken.append(line)
        return match

    monkeypatch.setattr(commit_lines, "_PLAIN_ADD", spy)
    commit_lines.read_commit((NEAR_MISSES[0] + "\n" + NEAR_MISSES[8] + "\n").encode(), table="t", version=1)
    assert taken == [NEAR_MISSES[0], NEAR_MISSES[8]]


def test_random_mutations_give_what_the_full_parse_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(31)
    alphabet = '{}[]":,\\/ -0123456789aeflnrstu\t\x1f\u00e9'
    lines = []
    for _ in range(3000):
        chars = list(BASE)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(chars))
            op = rng.random()
            if op < 0.4:
                chars[i] = rng.choice(alphabet)
            elif op < 0.7:
                del chars[i]
            else:
                chars.insert(i, rng.choice(alphabet))
        lines.append("".join(chars))
    for line in lines:
        fast, slow = _both((line + "\n").encode(), monkeypatch)
        assert fast == slow, line
