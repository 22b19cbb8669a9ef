"""kombu's own integration tests (its ``t/integration/common.py``, the classes every transport's
integration tests share), run against the fsjobstore transport. The file comes from kombu's source
distribution of the installed version, fetched at test time.

Run here: BasicFunctionality, BaseExchangeTypes, BaseTimeToLive, BasePriority, BaseMessage,
BaseEventLoop. Not run: BaseFailover, whose tests assume ``host:port`` URLs (a dead broker is one
whose port differs from the live one's); a directory has no port, and a store that cannot be opened
is covered by BasicFunctionality's ``test_failed_*`` tests.
"""

from __future__ import annotations

from pathlib import Path

import kombu
import pytest

from .upstream import load, source_tree

common = load(source_tree("kombu") / "t" / "integration" / "common.py", "kombu_upstream_integration_common")


@pytest.fixture
def connection(tmp_path: Path) -> kombu.Connection:
    return kombu.Connection(f"fsjobstore://{tmp_path}/store")


@pytest.fixture
def invalid_connection(tmp_path: Path) -> kombu.Connection:
    # A directory that holds something other than a store: refused, never made into one.
    (tmp_path / "not-a-store").mkdir()
    (tmp_path / "not-a-store" / "notes.txt").write_text("mine\n")
    return kombu.Connection(f"fsjobstore://{tmp_path}/not-a-store",
                            transport_options={"max_retries": 1})


class TestFSJobStoreBasicFunctionality(common.BasicFunctionality):
    pass


class TestFSJobStoreExchangeTypes(common.BaseExchangeTypes):
    pass


class TestFSJobStoreTimeToLive(common.BaseTimeToLive):
    pass


class TestFSJobStorePriority(common.BasePriority):
    PRIORITY_ORDER = "asc"  # AMQP's: a higher number is delivered first


class TestFSJobStoreMessage(common.BaseMessage):
    pass


class TestFSJobStoreEventLoop(common.BaseEventLoop):
    pass


def test_the_upstream_classes_are_kombus_own() -> None:
    # Guard against running an empty shell: the classes come from kombu's file, with their tests.
    assert common.__file__.endswith("t/integration/common.py")
    names = [n for n in dir(common.BasePriority) if n.startswith("test_")]
    assert len(names) >= 4, names
