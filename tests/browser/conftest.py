"""Fixtures of the dashboard's browser tests: ``bed``, one test's store, servers, workers and browser
(``harness.Bed``), all stopped at the end however the test ended.

The tests skip, saying why, when Selenium, the web extra, ``/usr/bin/chromium`` or
``/usr/bin/chromedriver`` is missing (``tests/browser/install.sh`` installs the last two, as root).
Screenshots of every step go to ``$FSJOBSTORE_SCREENSHOTS`` if set, else the test's
``tmp_path/screenshots``; a failed test adds one of where it stopped, and prints what its
processes said."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import harness

_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[_FAILED] = True
    return report


@pytest.fixture(scope="session")
def browser_tools() -> None:
    reason = harness.missing()
    if reason is not None:
        pytest.skip(f"browser tests need a browser: {reason}")


@pytest.fixture
def bed(browser_tools: None, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[harness.Bed]:
    shots = Path(os.environ[harness.SHOTS_ENV]) if os.environ.get(harness.SHOTS_ENV) else tmp_path / "screenshots"
    world = harness.Bed(tmp_path, shots, request.node.name)
    world.prelaunch()  # Chromium starts while the test starts its server and worker
    try:
        yield world
    finally:
        if request.node.stash.get(_FAILED, False):
            if world.browser is not None:
                try:
                    print(f"failed at {world.browser.driver.current_url}: {world.browser.shot('failed')}")
                except Exception as exc:
                    print(f"no screenshot of the failure: {exc!r}")
            print(world.output())
        world.close()
