"""The documentation site in the real browser: the home page, getting started and the API reference
render whole, from the site itself (nothing fetched from elsewhere), with nothing failing in the
page; a screenshot of each is kept (``$FSJOBSTORE_SCREENSHOTS``, else the test's directory)."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from doc_pages import build_site

from browser import harness


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def served_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("site")
    done = build_site(str(out))
    assert done.returncode == 0, f"the docs build failed:\n{done.stdout}\n{done.stderr}"
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out / "html")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("path", "heading", "shows"), [
    ("/index.html", "fsjobstore", "Getting started"),
    ("/getting-started.html", "Getting started", "fsjobstore worker ./jobs --handlers tasks:handlers"),
    ("/reference/api.html", "Python API reference", "pull_work"),
])
def test_a_page_of_the_docs_renders_whole_from_the_site_alone(browser_tools: None, served_site: str, tmp_path: Path,
                                                              path: str, heading: str, shows: str) -> None:
    shots = Path(os.environ[harness.SHOTS_ENV]) if os.environ.get(harness.SHOTS_ENV) else tmp_path / "screenshots"
    driver = harness.new_driver()
    try:
        browser = harness.Browser(driver, served_site, shots, f"docs-{path.strip('/').replace('/', '-')}")
        browser.open(path, "page")
        assert driver.find_element("css selector", "h1").text.startswith(heading)
        body = driver.find_element("css selector", "article").text
        assert shows in body
        loaded = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert loaded and all(url.startswith(served_site) for url in loaded), loaded
        # The theme's script ran: it sets the page's colour scheme on <body>.
        assert driver.execute_script("return document.body.dataset.theme") in ("auto", "light", "dark")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors
    finally:
        driver.quit()
