"""Airflow's UI in Chromium (playwright) for the page tests: a signed-in page, the Delta Mirror page."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from support.waiting import load_scaled


def signed_in_page(
    browser: Any, base: str, token: str, *, width: int = 1440, height: int = 900, timeout: float = 30
) -> Any:
    """A new page of ``browser`` whose cookie carries the API server's JWT ``token`` for ``base``;
    its waits last ``timeout`` seconds, stretched with the machine's load."""
    context = browser.new_context(viewport={"width": width, "height": height})
    context.add_cookies([{"name": "_token", "value": token, "url": base}])
    page = context.new_page()
    page.set_default_timeout(load_scaled(timeout) * 1000)
    return page


def open_delta_mirror_page(page: Any, base: str) -> Any:
    """Open Airflow's home at ``base``, click the nav entry "Delta Mirror" and wait for the
    overview's first row; the page's iframe (a playwright ``FrameLocator``)."""
    page.goto(f"{base}/")
    page.get_by_role("link", name="Delta Mirror").click()  # the nav entry
    # What the user sees, then where the app says it is. Not a wait for the URL ".../plugin/delta-mirror":
    # once the iframe has loaded, Airflow appends the iframe's own path to it
    # (/plugin/delta-mirror/delta-mirror/), so a late wait never saw it (a .ci/run on a loaded machine).
    frame = page.frame_locator("iframe")
    frame.locator("#overview tbody tr").first.wait_for()
    assert urlparse(page.url).path.startswith("/plugin/delta-mirror"), f"the nav entry led to {page.url}"
    return frame
