from __future__ import annotations

from collections.abc import Iterator

import pytest

# An installed wheel names the transport through its .pth file (tests/contrib/test_registration.py
# checks that in a fresh venv); an editable install has no .pth, so the tests import the module,
# which adds the alias itself.
import fsjobstore.contrib.kombu  # noqa: F401
from fsjobstore.contrib.kombu import close_stores


@pytest.fixture(autouse=True)
def _each_test_closes_the_stores_it_opened() -> Iterator[None]:
    # The transport and the backend keep one store per directory for the process's life; a test
    # process goes through hundreds of directories, and their descriptors would add up.
    yield
    close_stores()
