"""No page shows the commit service listening beyond 127.0.0.1 without the token and TLS beside
it (issue 39 finding 3: the README showed ``serve --host 0.0.0.0``, which sends the token and the
commits in clear text). ``serve``'s default is ``127.0.0.1``; an example that listens on every
interface sets ``DELTA_MIRROR_COMMIT_TOKEN`` and ``--ssl-certfile``/``--ssl-keyfile`` in the same
block."""

from __future__ import annotations

import re

from docs_kit import REPO, blocks, pages

EVERY_INTERFACE = re.compile(r"serve\b.*--host[ ,=]+(0\.0\.0\.0|::|\[::\])")


def test_every_serve_example_on_every_interface_has_the_token_and_tls_beside_it() -> None:
    found, unsafe = 0, []
    for page in [REPO / "README.md", *pages()]:
        for block in blocks(page):
            if not EVERY_INTERFACE.search(block.text.replace("\\\n", " ")):
                continue
            found += 1
            needs = ("DELTA_MIRROR_COMMIT_TOKEN", "--ssl-certfile", "--ssl-keyfile")
            if not all(n in block.text for n in needs):
                unsafe.append(f"{block.page}:{block.line}")
    assert found >= 2, "the pattern finds the examples (configuration.md, commit-service.md, scaling.md)"
    assert not unsafe, f"serve on every interface without the token and TLS beside it: {unsafe}"
