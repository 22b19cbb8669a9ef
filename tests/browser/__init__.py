"""The dashboard in a real browser (headless Chromium through Selenium).

A package (``browser``), as tests/distfs is, so that its conftest does not shadow tests/conftest.py,
which the project's tests import as ``conftest``."""
