from __future__ import annotations

# An installed wheel names the transport through its .pth file (tests/contrib/test_registration.py
# checks that in a fresh venv); an editable install has no .pth, so the tests import the module,
# which adds the alias itself.
import fsjobstore.contrib.kombu  # noqa: F401
