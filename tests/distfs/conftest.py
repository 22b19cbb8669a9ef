"""Fixtures for tests that need two "hosts" sharing one directory: the loopback GlusterFS bed (gluster.py).

tests/distfs is a package (distfs) so that this conftest does not shadow tests/conftest.py, which the
project's tests import as `conftest`. Elsewhere: `sys.path.insert(0, "tests")`, then `from distfs import gluster`.
"""

from __future__ import annotations

import itertools
import re
import shutil
from collections.abc import Iterator

import pytest

from distfs import gluster
from distfs.gluster import SharedDir

_serial = itertools.count()
_HERE = __file__.rsplit("/", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of the bed in one xdist worker (the suite runs with ``--dist loadgroup``): a bed
    listens on a fixed port and reaps stale beds when it starts, so two at once would fight."""
    for item in items:
        if str(item.path).startswith(_HERE):
            item.add_marker(pytest.mark.xdist_group("glusterfs-bed"))


@pytest.fixture(autouse=True)
def _renameat2_as_it_was() -> Iterator[None]:
    """A store on the volume turns off RENAME_NOREPLACE for its whole process (GlusterFS answers
    EINVAL; _syscalls.rename_noreplace then links and unlinks): give later tests of this xdist
    process back the local filesystems' renameat2. Without this, the fault tests that ran after
    an in-process store on the volume counted a link and an unlink where they expect one rename
    (5 failures in a CI run, 2026-11-27)."""
    from fsjobstore._os import _syscalls

    saved = _syscalls._renameat2
    yield
    _syscalls._renameat2 = saved


@pytest.fixture(scope="session")
def gluster_bed() -> Iterator[gluster.GlusterBed]:
    """glusterd and the volume, started once per session, with two DEFAULT mounts named "a" and "b"."""
    reason = gluster.available()
    if reason is not None:
        pytest.skip(f"GlusterFS bed unavailable: {reason}")
    with gluster.GlusterBed() as bed:
        bed.mount("a")
        bed.mount("b")
        yield bed


@pytest.fixture
def shared_dir(gluster_bed: gluster.GlusterBed, request: pytest.FixtureRequest) -> Iterator[SharedDir]:
    """A fresh empty directory of the volume for this test, seen through mount A and through mount B."""
    gluster_bed.heal()  # an earlier test may have left a client stopped or killed
    a, b = gluster_bed.mounts["a"], gluster_bed.mounts["b"]
    name = f"t{next(_serial):03d}-" + re.sub(r"[^\w.-]", "_", request.node.name)[:60]
    (a.path / name).mkdir()
    yield SharedDir(a.path / name, b.path / name, a, b)
    gluster_bed.heal()
    shutil.rmtree(a.path / name)  # through mount A, so the next test starts from an empty volume again


@pytest.fixture
def stores(shared_dir: SharedDir) -> Iterator[tuple[str, str]]:
    """One store as the two hosts see it: (host A's path, host B's path), made through A."""
    from fsjobstore import JobStore

    a, b = str(shared_dir.a / "store"), str(shared_dir.b / "store")
    JobStore(a).close()
    yield a, b
