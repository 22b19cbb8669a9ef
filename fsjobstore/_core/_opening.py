"""Opening a store: its root, its marker file, its directories, and the settings that belong to
the store rather than to one process (its format, its durability, the group that shares it).

A store is made only where nothing else is: in a missing directory, or an empty one. A directory
holding other files and no ``fsjobstore.json`` is refused, so a typo cannot scatter a store's
directories into ``/tmp`` or a project tree, and ``create=False`` (what read-only tools use)
never makes one at all. The marker is written first and every directory after it, all fsynced
whatever the store's ``durable`` says: losing recent jobs to a power cut is what
``durable=False`` allows, losing the store is not.
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import secrets
import stat
import time
from dataclasses import dataclass
from typing import Any

from .._errors import InvalidRequest, StoreFormatError, StoreNotFound, UntrustedStore
from .._format._layout import FORMAT_VERSION, MARKER, Layout
from .._format._records import FOREVER
from .._format._values import dumps, integer, number
from .._os import _files as fs
from .._os import _syscalls as sc
from . import _buckets
from ._tree import DEFAULT_RETAIN, Tree

log = logging.getLogger("fsjobstore")

_MARKER_CAP = 65536
_MIGRATE_READ_CAP = 1 << 30  # a job file of any size this library wrote
_INIT_PREFIX = f".{MARKER}."  # a marker being written: .fsjobstore.json.<hex>.init
# What an "empty" directory may hold: a filesystem's own lost+found (a store at the root of
# a dedicated mount), and the temp file of a store creation that died before its link.
_IGNORED_IN_EMPTY = frozenset({"lost+found"})


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """The settings recorded in ``fsjobstore.json``."""

    format: int
    durable: bool  # what the store promises: every process fsyncs at least this much
    perms: fs.Perms  # private to its owner, or shared with a group
    created_at: float
    retain: float = DEFAULT_RETAIN  # seconds a final job is kept by default (math.inf: forever)


def _check_ancestors(root: str) -> None:
    """A root that is not there yet, below a file (``/etc/passwd/jobs``): say which is the file,
    where opening the marker would say only "Not a directory". Ancestors may be links to
    directories."""
    up = os.path.dirname(os.path.abspath(root))
    while not os.path.lexists(up) and os.path.dirname(up) != up:
        up = os.path.dirname(up)
    if os.path.lexists(up) and not os.path.isdir(up):
        raise StoreNotFound(f"{up} is a file, not a directory: there can be no store at {root}")


def open_skeleton(layout: Layout, *, durable: bool | None, group: str | int | None,
                  create: bool, retain: float | None = None, read_only: bool = False) -> StoreConfig:
    """Find (or, where allowed, make) the store at ``layout.root``, check it is ours to use and
    that this process's settings agree with it, and make sure every directory exists.
    ``read_only``: change nothing (:func:`_open_to_read`)."""
    if read_only:
        with sc.reading_only():
            return _open_to_read(layout, group)
    root = layout.root
    wanted_gid = None if group is None else _resolve_group(group)
    exists = os.path.lexists(root)
    if exists and not fs.is_real_dir(root):
        raise StoreNotFound(f"{root} is a file, not a store directory")
    if not exists:
        _check_ancestors(root)
    if exists and not _may(root, os.R_OK | os.W_OK | os.X_OK):
        readable = _may(root, os.R_OK | os.X_OK)
        to_read = ("open it read-only, which changes nothing: JobStore(path, read_only=True), "
                   "or fsjobstore web DIR --read-only")
        if readable and os.stat(root).st_uid == os.geteuid():  # its own store, made read-only (a copy)
            raise UntrustedStore(f"{root} can be read but not written by this user (uid {os.geteuid()}), "
                                 f"its owner: make it writable, or {to_read}")
        raise UntrustedStore(
            f"{root} cannot be read and written by this user (uid {os.geteuid()}): a store used by several "
            "users must be created with JobStore(path, group=...), and each user be in that group"
            + (f"; to only read it, {to_read}" if readable else "")
        )
    doc = _read_marker(layout)
    made_now = False
    if doc is None:
        what = _examine(root)
        if what == "other" and _looks_like_store(layout):
            doc = _readopt(layout, durable)
        elif what == "other":
            if not create:  # only reading: say what is there, not why we would not make one
                raise StoreNotFound(f"{root} holds other files and no {MARKER}: it is not a store (check the path)")
            raise StoreNotFound(
                f"{root} is not empty and holds no {MARKER}, so it is not a store; refusing to make "
                "one among other files (choose a new or an empty directory)"
            )
        elif not create:
            empty = " (the directory is empty)" if what == "empty" else ""
            raise StoreNotFound(f"there is no store at {root}{empty}; check the path, or make one "
                                "(fsjobstore init DIR, or JobStore(path) in Python)")
        else:
            doc = _initialise(layout, durable=True if durable is None else durable, gid=wanted_gid,
                              retain=DEFAULT_RETAIN if retain is None else retain)
            made_now = True
    config = _config(layout, doc, durable)
    made_as = config.format
    if config.format < 2:
        config = _migrate(layout, doc, config)
    _check_access(root, config.perms)
    if wanted_gid is not None and config.perms.gid != wanted_gid:
        have = "is private to its owner" if config.perms.gid is None else f"is shared with gid {config.perms.gid}"
        raise InvalidRequest(f"the store at {root} {have}; it cannot be opened with group={group!r}")
    if durable is False and config.durable:
        raise InvalidRequest(
            f"durable=False asks for less than the store at {root} promises: it was created with "
            "durable=True, and every process sharing it keeps that promise. Open it without durable=False."
        )
    # From here on every path below the root is resolved beneath it, never through a link (the
    # caller detaches when the store closes): a link, FIFO or file planted where a directory
    # belongs is quarantined and a directory made in its place (_beneath), here at open too.
    sc.attach(root, config.perms.dir_mode)
    try:
        for directory in layout.all_dirs():
            fs.ensure_dir(directory, durable=True, mode=config.perms.dir_mode)
            fs.fsync_dir(directory)  # opens it as a directory: whatever else is planted there is moved aside
            fs.check_trusted(directory, config.perms)
        sc.prime(root)
        boot = layout.boot_marker()
        if made_now and not config.durable and not boot.endswith("-unknown"):
            # Made during this boot: no power cut before it can have emptied a file of it, so
            # its first worker skips the pass that looks for them (_power_loss, made only in a store
            # that does not fsync), however deep its backlog is by then.
            with contextlib.suppress(OSError):
                fs.touch(boot, config.perms.file_mode)
        if config.format < FORMAT_VERSION:
            # A store made before retention promised to keep every job: an upgrade keeps that
            # promise (forever) unless the opener asks for a retention period itself.
            config = _migrate_to_3(layout, config, FOREVER if retain is None else retain, made_as)
    except BaseException:
        sc.detach(root)
        raise
    return config


def _open_to_read(layout: Layout, group: str | int | None) -> StoreConfig:
    """Open the store at ``layout.root`` to read it only: nothing is made, upgraded, readopted or
    repaired. A store that would need any of that is refused, saying so; a missing directory
    reads as empty, and one planted as a link, FIFO or file as missing (left where it is)."""
    root = layout.root
    if not fs.is_real_dir(root):
        raise StoreNotFound(f"there is no store at {root}; a read-only open makes none")
    if not os.access(root, os.R_OK | os.X_OK):
        raise UntrustedStore(f"{root} cannot be read by this user (uid {os.geteuid()})")
    doc = _read_marker(layout)
    if doc is None:
        raise StoreNotFound(f"{root} holds no {MARKER}: it is not a store, or one a writable open must "
                            "repair first (a read-only open changes nothing)")
    config = _config(layout, doc, None)
    if config.format < FORMAT_VERSION:
        raise StoreFormatError(f"the store at {root} is in format {config.format}: a writable open upgrades it "
                               f"to {FORMAT_VERSION} (a read-only open changes nothing)")
    if group is not None and config.perms.gid != _resolve_group(group):
        raise InvalidRequest(f"the store at {root} is not shared with group={group!r}")
    sc.attach(root, config.perms.dir_mode)
    try:
        for directory in layout.all_dirs():
            try:
                st = sc.lstat(directory)
            except FileNotFoundError:
                continue  # missing, or below something planted: read as empty
            if not stat.S_ISDIR(st.st_mode):
                log.warning("%s is not a directory: read as missing (a read-only store repairs nothing)", directory)
                continue
            fs.check_trusted(directory, config.perms)
    except BaseException:
        sc.detach(root)
        raise
    return config


# == reading ==========================================================================================
def _read_marker(layout: Layout) -> dict[str, Any] | None:
    """The marker's document, or None if there is none (or it is empty: a creation cut short)."""
    try:
        data = fs.read_regular(layout.marker, _MARKER_CAP)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except fs.Unreadable as exc:
        raise StoreFormatError(f"{layout.marker} {exc}") from None
    if not data.strip():
        return None  # written but never flushed before a power cut (by a version before format 2)
    try:
        doc = json.loads(data)
    except ValueError:
        raise StoreFormatError(f"{layout.marker} is not valid JSON; this is not a store fsjobstore can open") from None
    if not isinstance(doc, dict):
        raise StoreFormatError(f"{layout.marker} does not hold a JSON object")
    return doc


def _config(layout: Layout, doc: dict[str, Any], durable: bool | None) -> StoreConfig:
    version = doc.get("format")
    version = integer(version, f"the format version in {layout.marker}", at_least=1, error=StoreFormatError)
    if version > FORMAT_VERSION:
        raise StoreFormatError(
            f"{layout.root} holds a format {version} store, made by a newer fsjobstore; this one reads "
            f"formats 1 to {FORMAT_VERSION}"
        )
    recorded = doc.get("durable")
    if version >= 2 and not isinstance(recorded, bool):
        raise StoreFormatError(f"{layout.marker} has no durable setting")
    group = doc.get("group")
    gid = group.get("gid") if isinstance(group, dict) else None
    if group is not None:
        integer(gid, f"the group's gid in {layout.marker}", at_least=0, error=StoreFormatError)
    created = doc.get("created_at")
    recorded_retain = doc.get("retain", DEFAULT_RETAIN)
    kept = FOREVER if recorded_retain is None else number(
        recorded_retain, f"the retain setting in {layout.marker}", at_least=0, error=StoreFormatError)
    return StoreConfig(
        retain=kept,
        format=version,
        # Format 1 did not record durability; until it is migrated the process decides, as then.
        durable=recorded if isinstance(recorded, bool) else (True if durable is None else durable),
        perms=fs.Perms(gid),
        created_at=float(created) if isinstance(created, int | float) and not isinstance(created, bool) else 0.0,
    )


def _examine(root: str) -> str:
    """"missing", "empty" or "other" (a directory with something in it)."""
    try:
        names = sc.listdir(root)
    except FileNotFoundError:
        return "missing"
    left = [n for n in names if n not in _IGNORED_IN_EMPTY and not n.startswith(_INIT_PREFIX)]
    return "other" if left else "empty"


def _looks_like_store(layout: Layout) -> bool:
    """A store whose marker is missing or empty but whose directories are all there: a store made
    by a version before format 2 with durable=False, whose marker a power cut emptied."""
    return all(fs.is_real_dir(d) for d in (layout.jobs, layout.pending, layout.active, layout.leases, layout.ids))


# == writing ==========================================================================================
def _initialise(layout: Layout, *, durable: bool, gid: int | None, retain: float) -> dict[str, Any]:
    root = layout.root
    perms = fs.Perms(gid)
    fs.makedirs(os.path.dirname(root))
    made = True
    try:
        sc.mkdir(root, perms.dir_mode)
    except FileExistsError:
        made = False  # an empty directory someone prepared (or a racing opener made)
    if not made:
        fs.check_trusted(root, perms)  # still refuse a world-writable one: others could plant in it
    st = sc.lstat(root)
    if st.st_uid == os.geteuid():
        if gid is not None and st.st_gid != gid:
            sc.chown(root, -1, gid)
        sc.chmod(root, perms.dir_mode)  # the umask (or whoever made it) decided its mode so far
    if made:
        fs.fsync_dir(os.path.dirname(root))
    doc: dict[str, Any] = {"format": FORMAT_VERSION, "created_at": time.time(), "durable": durable,
                           "group": None if gid is None else {"gid": gid, "name": _group_name(gid)},
                           "retain": _retain_field(retain)}
    _write_marker(layout, doc, perms, replace=False)
    log.info("created a store at %s (durable=%s%s)", root, durable, "" if gid is None else f", gid {gid}")
    again = _read_marker(layout)
    assert again is not None
    return again


def _readopt(layout: Layout, durable: bool | None) -> dict[str, Any]:
    log.warning("%s had no readable %s but holds a store's directories: writing a new marker", layout.root, MARKER)
    doc: dict[str, Any] = {"format": 1, "created_at": time.time()}
    _write_marker(layout, doc, fs.PRIVATE, replace=True)
    return doc


def _migrate(layout: Layout, doc: dict[str, Any], config: StoreConfig) -> StoreConfig:
    """Format 1 to 2: job files of format 1 are read as they are; only the marker changes, and
    with it the store's durability becomes recorded (as this process opens it). Format 3
    follows (:func:`_migrate_to_3`), once the tree is in place."""
    new = dict(doc, format=2, durable=config.durable, group=None, migrated_from=config.format)
    _write_marker(layout, new, config.perms, replace=True)
    log.warning("upgraded the store at %s from format %d to 2", layout.root, config.format)
    return StoreConfig(2, config.durable, config.perms, config.created_at, config.retain)


def _migrate_to_3(layout: Layout, config: StoreConfig, retain: float, made_as: int) -> StoreConfig:
    """Format 2 to 3: every final job gets its finished-index entry (its ``finished_at`` from
    its file, kept for ``retain``, the store's default from now on), every pending job moves
    into its bucket, then the marker says 3.

    Under ``control/migrate.lock`` (flock), so concurrent opens take turns and the second finds
    the marker rewritten. A crash midway leaves format 2 in the marker: the next open does it
    all again (an entry already there is fine). A file that cannot be read is left as it is, for
    the quarantine that whoever reads it next makes."""
    lock = os.path.join(layout.control, "migrate.lock")
    fd = fs.open_lock(lock, config.perms)
    try:
        sc.lock_blocking(fd)
        doc = _read_marker(layout)
        if doc is None:
            raise StoreFormatError(f"{layout.marker} went away while the store was being upgraded")
        if integer(doc.get("format"), "format", error=StoreFormatError) >= FORMAT_VERSION:
            return _config(layout, doc, config.durable)  # another process did it meanwhile
        # No doorbell: it only indexes jobs already final, no news for a waiter.
        tree = Tree(layout, durable=False, record_cap=_MIGRATE_READ_CAP, perms=config.perms, default_retain=retain)
        indexed = tree.index_unindexed(set())
        for queue in fs.scan_names(layout.pending):  # pending jobs into their buckets (_buckets)
            qdir = layout.pending_dir(queue)
            if fs.is_real_dir(qdir):
                tree.settle_flat(qdir, _buckets.flat_jobs(qdir, _buckets.list_queue(qdir)[1]))
        new = dict(doc, format=FORMAT_VERSION, retain=_retain_field(retain), migrated_from=made_as)
        _write_marker(layout, new, config.perms, replace=True)
    finally:
        sc.close(fd)  # releases the flock
    log.warning("upgraded the store at %s from format %d to %d (%d final jobs indexed)",
                layout.root, made_as, FORMAT_VERSION, indexed)
    return StoreConfig(FORMAT_VERSION, config.durable, config.perms, config.created_at, retain)


def _retain_field(retain: float) -> float | None:
    return None if retain == FOREVER else retain


def _write_marker(layout: Layout, doc: dict[str, Any], perms: fs.Perms, *, replace: bool) -> None:
    """Write the marker durably: a temp file in the root, fsynced, then linked (a new store: the
    first of several racing creators wins) or renamed over the old one; then the root fsynced."""
    tmp = os.path.join(layout.root, f"{_INIT_PREFIX}{secrets.token_hex(8)}.init")
    fs.write_new(tmp, dumps(doc) + b"\n", durable=True, mode=perms.file_mode)
    try:
        if replace:
            sc.rename(tmp, layout.marker)
        else:
            # Another process may have made the store at the same moment: theirs stands.
            with contextlib.suppress(FileExistsError):
                sc.link(tmp, layout.marker)
        fs.fsync_dir(layout.root)
    finally:
        fs.unlink_quietly(tmp)


# == sharing ==========================================================================================
def _resolve_group(group: str | int) -> int:
    if isinstance(group, bool) or not isinstance(group, str | int):
        raise InvalidRequest(f"group must be a group name or a gid, not {type(group).__name__}")
    if isinstance(group, int):
        if group < 0:
            raise InvalidRequest(f"group must be a non-negative gid, got {group}")
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise InvalidRequest(f"there is no group named {group!r} on this system") from None


def _group_name(gid: int) -> str | None:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None


def _may(path: str, mode: int) -> bool:
    if os.access in os.supports_effective_ids:
        return os.access(path, mode, effective_ids=True)
    return os.access(path, mode)


def _check_access(root: str, perms: fs.Perms) -> None:
    fs.check_trusted(root, perms)
    gid = perms.gid
    if gid is None or os.geteuid() == 0 or gid == os.getegid() or gid in os.getgroups():
        return
    name = _group_name(gid)
    raise UntrustedStore(
        f"the store at {root} is shared with group {name or gid}, and this process is not a member of it"
    )
