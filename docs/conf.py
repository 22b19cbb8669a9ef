"""Sphinx configuration of the fsjobstore documentation.

Build (warnings are errors; nothing is fetched from the internet, at build time or by the pages):

    pip install ".[docs]"
    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

Serve what was built: ``python -m http.server -d docs/_build/html 8000``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))

import fsjobstore

project = "fsjobstore"
author = "the fsjobstore developers"
copyright = "the fsjobstore developers"
release = version = fsjobstore.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "fsjobstore_reference",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "screenshots"]

myst_enable_extensions = ["colon_fence", "deflist"]
smartquotes = False  # "--init" must stay two hyphens, to be copied as an option
myst_heading_anchors = 4

# The reference documents exactly ``fsjobstore.__all__`` (tests/test_docs.py checks it), in the
# order the source gives; type hints in the description, where long signatures stay readable.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_preserve_defaults = True
# Names in hints that are no page of ours and no page this offline build may link to.
nitpick_ignore_regex = [
    ("py:class", r"(os|collections\.abc|typing|types|datetime|concurrent\.futures|enum|asyncio|threading)\..*"),
    ("py:class", r"(Any|Callable|Iterator|Iterable|Mapping|Sequence|Awaitable|T|P|R|ReturnT)"),
    ("py:class", r"fsjobstore\._.*"),
    ("py:class", r"(re\.Pattern|pathlib\.Path|PathLike|socket\..*|select\..*|logging\..*)"),
    ("py:class", r"(Duration|Value|JSON|Handler|Hook|OnCompromised|BackoffFn|Interest|Queues|Target)"),
    ("py:.*", r".*\.(__init__|__new__)"),
    # Private bases and helpers a public signature or docstring names.
    ("py:class", r"(Core|WorkClaimed|NotificationClaimed|Mode|fsjobstore\.schedule\.Timing)"),
    ("py:data", r"(ENDINGS|RETRY_AFTER|NAMES)"),
]

html_theme = "furo"
html_title = f"fsjobstore {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
html_favicon = "../fsjobstore/web/static/icon.svg"  # the dashboard's icon
html_theme_options = {
    # Furo uses the system's fonts: nothing from a font service.
    "navigation_with_keys": True,
}
