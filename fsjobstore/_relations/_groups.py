"""Groups (``create_group``): several jobs made at once, all or none (FORMAT.md, "Groups").

1. Every member's record is built and checked, and every parent outside the group must exist,
   before anything is written.
2. ``groups/.<gid>.<owner>.open`` (empty) says a group is being made, by whom.
3. The **manifest** ``groups/<gid>.json`` (every member's record, one per line after a header
   line) is written to a temp file and linked into place: the commit point. A link has one
   winner, so a group id can be used once (``JobExists``), and from here the group exists whole.
4. Each member is published as a create with a chosen id is (its ``ids/`` reservation makes
   publishing it twice impossible), in order, so a member's parents in the group exist first.
5. The ``.open`` marker goes.

Killed before 3: nothing was published; recovery removes the marker (and the temp files). Killed
after 3: recovery finds the marker of a gone owner and publishes the members still missing from
the manifest, then removes the marker. So a group is made whole or not at all, and a caller
that got its answer has all of it. The manifest stays while a member does: ``wait_group`` and
``get_group`` read it; the removal of a group's last member removes it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from .._core._core import Core
from .._errors import InvalidJobId, InvalidRequest, JobExists, JobNotFound, StorageError
from .._format._job import Job
from .._format._layout import generated_id
from .._format._records import Record
from .._format._values import MAX_ID_LENGTH, check_job_id, check_name, dumps
from .._os import _files as fs
from .._os import _syscalls as sc

log = logging.getLogger("fsjobstore")

MAX_MEMBERS = 10_000
_MANIFEST_CAP = 256 << 20


@dataclass(frozen=True, slots=True)
class Group:
    """A group's id and its members' snapshots, in the order they were given."""

    id: str
    jobs: tuple[Job, ...]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(job.id for job in self.jobs)

    @property
    def done(self) -> bool:
        """Whether every member is final."""
        return all(job.state.is_final for job in self.jobs)


def new_group_id(core: Core, group_id: str | None) -> str:
    if group_id is None:
        return generated_id(core.next_seq())
    return check_name(group_id, what="group id", max_length=MAX_ID_LENGTH, error=InvalidJobId)


def _marker(core: Core, gid: str) -> str:
    return f"{core.layout.groups}/.{gid}.{core.owner_id()}.open"


def make(core: Core, gid: str, records: list[Record], publish: Callable[[Record], object]) -> None:
    """Steps 2-5 of the module docstring; ``publish(record)`` publishes one member (idempotent:
    a member already published is passed over)."""
    tree, lay = core.tree, core.layout
    marker = _marker(core, gid)
    try:
        sc.mknod(marker, tree.perms.file_mode)
    except FileNotFoundError:
        tree.ensure_dir(lay.groups)
        sc.mknod(marker, tree.perms.file_mode)
    try:
        header = dumps({"group": gid, "members": len(records), "created_at": core.wall()}, what="group")
        body = header + b"\n" + b"".join(r.to_bytes() for r in records)
        tmp = lay.tmp_path(core.new_token(), "aux", f"{gid}.group")
        tree.write_new(tmp, body)
        try:
            tree.link_into(tmp, lay.group_path(gid))
        except FileExistsError:
            raise JobExists(f"a group with id {gid!r} exists in this store") from None
        finally:
            fs.unlink_quietly(tmp)
    except BaseException:
        fs.unlink_quietly(marker)
        raise
    for record in records:  # the group exists: from here on, a failure is finished by recovery
        publish(record)
    fs.unlink_quietly(marker)


def read(core: Core, gid: str) -> list[Record]:
    """The members' records, as the manifest has them; JobNotFound for an unknown group."""
    check_job_id(gid)
    try:
        data = fs.read_regular(core.layout.group_path(gid), _MANIFEST_CAP)
    except FileNotFoundError:
        raise JobNotFound(f"no group with id {gid!r} in {core.layout.root}") from None
    except fs.Unreadable as exc:
        raise JobNotFound(f"group {gid!r}: its manifest {exc}") from None
    lines = data.splitlines(keepends=True)
    try:
        head = json.loads(lines[0])
        records = [Record.from_bytes(line) for line in lines[1:]]
    except (ValueError, IndexError) as exc:
        raise JobNotFound(f"group {gid!r}: its manifest cannot be read ({exc})") from None
    if not isinstance(head, dict) or head.get("group") != gid or head.get("members") != len(records):
        raise JobNotFound(f"group {gid!r}: its manifest is incomplete")
    return records


def sweep(core: Core, publish: Callable[[Record], object], gone: Callable[[str], bool],
          each: Callable[[str], AbstractContextManager[None]]) -> int:
    """Finish the groups whose makers died after their manifest (recovery); remove the markers
    of those that died before it. How many members were published. ``each`` guards the repairs
    of one group (``Sweep.each``)."""
    lay = core.layout
    published = 0
    for name in fs.scan_names(lay.groups):
        if not (name.startswith(".") and name.endswith(".open")):
            continue
        parts = name[1:-len(".open")].rsplit(".", 1)
        if len(parts) != 2 or not gone(parts[1]):
            continue
        with each(parts[0]):
            published += _finish_group(core, publish, parts[0], name)
    return published


def _finish_group(core: Core, publish: Callable[[Record], object], gid: str, marker: str) -> int:
    """Publish what is missing of group ``gid``, whose maker died, then drop its ``marker``."""
    try:
        records = read(core, gid)
    except JobNotFound:
        records = []  # died before its manifest: nothing of it was published
    published = 0
    for record in records:
        if core.tree.locate(record.id) is None:
            try:
                publish(record)
                published += 1
            except JobExists:
                pass
            except StorageError as exc:
                log.warning("group %s: member %s could not be published now: %s", gid, record.id, exc)
                return published
    fs.unlink_quietly(os.path.join(core.layout.groups, marker))
    return published


def forget_if_empty(core: Core, gid: str) -> None:
    """A member of group ``gid`` was removed: once none is left, the manifest goes too."""
    try:
        records = read(core, gid)
    except JobNotFound:
        return
    if any(core.tree.exists(r.id) for r in records):
        return
    if not any(n.startswith(f".{gid}.") for n in fs.scan_names(core.layout.groups)):  # not being made
        fs.unlink_quietly(core.layout.group_path(gid))


def check_size(n: int) -> None:
    if not 0 < n <= MAX_MEMBERS:
        raise InvalidRequest(f"a group has 1 to {MAX_MEMBERS} jobs, got {n}")

