"""The bare put-if-absent loop as a whole process (the publish figure's peer): the commit files of
a published folder written again to a new folder with ``put_if_absent`` + ``head`` read-back, no
database. Usage: ``python benchmarks/bare_publish.py SOURCE_TABLE DEST_TABLE``."""

from __future__ import annotations

import sys
from pathlib import Path

from delta_mirror.storage import open_store


def main(source: str, dest: str) -> int:
    folder = Path(source) / "_delta_log"
    files = sorted(p for p in folder.iterdir() if p.name.endswith(".json") and p.name[:20].isdigit())
    objects = open_store(dest)
    for p in files:
        data, path = p.read_bytes(), f"_delta_log/{p.name}"
        objects.put_if_absent(path, data)
        meta = objects.head(path)
        if meta is None or meta.size != len(data):
            raise RuntimeError(f"{path} not durable")
    print(len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
