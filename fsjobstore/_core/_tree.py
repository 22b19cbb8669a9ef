"""Operations on one store's tree that both the store and recovery perform.

Every transition ends in :meth:`Tree.publish` or :meth:`Tree.publish_final`: a fully written
file is renamed (for final states, with a rename that never replaces an existing result) into
the directory of its new state, and that directory is fsynced before the caller removes any old
entry. A crash between the two leaves the job in two places, which recovery resolves; never in
none.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Callable

from .._errors import StorageError
from .._format._layout import (
    FINAL_RE,
    Layout,
    bucket_of_name,
    expiry,
    micros,
)
from .._format._records import FINAL_STATES, LostJobData, Parsed, Record, lost_data
from .._os import _files as fs
from .._os import _syscalls as sc
from . import _buckets
from ._finding import Finding, Location
from ._quarantine import move_aside

log = logging.getLogger("fsjobstore")

DESTS = ("pending", "scheduled", "deferred", *FINAL_STATES)
DEFAULT_RETAIN = 7 * 24 * 3600.0  # a new store's default retention (FORMAT.md, "Opening")
# What link() says where a finished-index entry cannot be a link (an empty file is made instead):
# EPERM (no hard links here, or protected_hardlinks), EMLINK (a link count at its limit), and the
# answers of filesystems without link().
_NO_LINK = frozenset({errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS,
                      errno.EXDEV})


class Tree(Finding):
    def __init__(self, layout: Layout, *, durable: bool, record_cap: int, perms: fs.Perms = fs.PRIVATE,
                 ring: Callable[[str], None] | None = None, default_retain: float = DEFAULT_RETAIN,
                 lagging: bool = False, emptiable: bool = False) -> None:
        """``ring``: the doorbell's, rung after a job becomes due ("work") or final ("done"), so
        no other host's waiter sleeps past it (None: no doorbell). ``default_retain``: seconds a
        job is kept once final when its record does not say (a format-2 job): the store's
        recorded default. ``lagging``: reads may lag behind another host's writes (a network
        filesystem). ``emptiable``: the store was made with durable=False, so a power cut may
        empty files."""
        self.layout, self.durable, self.record_cap, self.perms = layout, durable, record_cap, perms
        self._ring = ring
        self.default_retain = default_retain
        self.lagging = lagging
        self.emptiable = emptiable

    @property
    def bucket_keep(self) -> float:
        """Seconds an emptied pending bucket must stay unchanged before it is removed: on a
        network filesystem ``_buckets.NETWORK_KEEP`` (see ``_buckets``), else 0 (no such rule)."""
        return _buckets.NETWORK_KEEP if self.lagging else 0.0

    def bell(self, kind: str) -> None:
        if self._ring is not None:
            self._ring(kind)

    # -- writing, with this store's durability and permissions --------------------------------
    def write_new(self, path: str, data: bytes) -> None:
        fs.write_new(path, data, durable=self.durable, mode=self.perms.file_mode)

    def ensure_dir(self, path: str) -> None:
        fs.ensure_dir(path, durable=self.durable, mode=self.perms.dir_mode)

    def link_into(self, src: str, dst: str) -> None:
        fs.link_into(src, dst, durable=self.durable)

    def rename_into(self, src: str, dst: str) -> None:
        fs.rename_into(src, dst, durable=self.durable)

    # -- reading -------------------------------------------------------------------------------
    def read_record(self, path: str) -> Record:
        """Raises FileNotFoundError, or fs.Unreadable / ValueError naming what is wrong."""
        return self.read_parsed(path).record

    def read_job(self, loc: Location) -> Record:
        """The record of the job at ``loc``. A file in a final state that holds no result (no result
        line, and a record not written final) lost that line to a power cut: LostJobData."""
        parsed = self.read_parsed(loc.path)
        # On a network filesystem another host's result line (appended in place) can read cut
        # off until the cached size expires (GlusterFS: 1 s; tests/distfs saw it): read again.
        for pause in (0.05, 0.2, 0.5, 1.0) if self.lagging and _no_result(loc, parsed) else ():
            time.sleep(pause)
            if not _no_result(loc, parsed := self.read_parsed(loc.path)):
                break
        if _no_result(loc, parsed):
            raise LostJobData(f"is in {loc.state.value}/ but holds no result: {lost_data(self.emptiable)}")
        return parsed.record

    def read_parsed(self, path: str) -> Parsed:
        """Like :meth:`read_record`, with the result line's final state and the whole length."""
        return self.read_parsed_links(path)[0]

    def read_parsed_links(self, path: str) -> tuple[Parsed, int, bytes]:
        """:meth:`read_parsed`, and how many hard links the file has besides its name and its
        ``ids/<id>`` (:func:`fs.foreign_links`). Such a file was planted by ``link`` (or is in a
        hard-linked backup): it is read as a job only if every member could read and write it
        anyway; otherwise it is :class:`fs.Unreadable` and the callers quarantine it, since
        reading it could show a member what they may not read (FORMAT.md, "Trust"). Whoever writes to
        it first makes a private copy (:meth:`private_copy`)."""
        data, st = fs.read_regular_stat(path, self.record_cap)
        try:
            parsed = Record.parse(data)  # and the bytes, for that copy
        except LostJobData as exc:
            raise LostJobData(f"{exc}: {lost_data(self.emptiable)}") from None
        extra = fs.foreign_links(st, self.layout.id_marker(parsed.record.id)) if st.st_nlink > 1 else 0
        if extra and not self._shared_anyway(st):
            raise fs.Unreadable(f"has {extra} hard link(s) elsewhere and is not the store's own file "
                                f"(owner {st.st_uid}, group {st.st_gid}, mode {stat.filemode(st.st_mode)})")
        return parsed, extra, data

    def _shared_anyway(self, st: os.stat_result) -> bool:
        if self.perms.gid is None:
            return st.st_uid == os.geteuid()  # nobody else can link into a private store
        return st.st_gid == self.perms.gid and st.st_mode & 0o060 == 0o060

    def private_copy(self, path: str, data: bytes, tmp: str) -> None:
        """Replace ``path`` (a name of ours) by a copy of ``data`` in a new file, so a write to
        it never reaches the other names of a hard-linked file."""
        self.write_new(tmp, data)
        try:
            self.rename_into(tmp, path)
        except BaseException:
            fs.unlink_quietly(tmp)
            raise

    def publish_final(self, path: str, record: Record, state: str, finished_at: float) -> str:
        """Move a claimed file that ends in its result line into ``state``'s directory in one
        rename that never replaces an existing result (FileExistsError instead), then make
        the new entry durable. FileNotFoundError: ``path`` was moved (taken over).

        Every final job is published here, so here it gets its finished-index entry: a second
        name of the very file published (a hard link: no new inode on the commit's path), made
        before the rename and never fsynced on its own: the directory fsync after the rename
        makes it durable too (name operations reach the disk in program order). An entry whose
        rename then fails is stale, and whoever meets it unlinks it (``_retention``).

        Two publishers of one result (a holder and the take-over that fenced it) share the
        entry's name, and only one of them makes it. The one that made it and whose rename met
        ENOENT unlinks it, then makes it again from the final file if that is there; the one
        that found it made and whose rename succeeded makes it again after. So whichever order
        the four steps take, a published job keeps its entry, and a job that the winner
        published and retention already removed does not get a stale one back (otherwise the
        loser's entry outlives the job, as a chaos run showed). A holder whose file was moved
        before its entry was made makes none: the link meets ENOENT, as the rename would."""
        made = self.index_final(record, state, finished_at, path)
        dst = self.layout.final_path(state, record.id)
        try:
            self._rename_final(path, dst)
        except OSError as exc:
            if made:
                # Ours, naming a job that is not there: unlinked whatever the error, since it is
                # a second name of the claimed file, which a retry of this commit appends to in
                # place (a file with a link it does not know is a planted one). A fault in this
                # unlink as well leaves it, and that retry finds the file linked.
                fs.unlink_quietly(self.finished_entry(record, state, finished_at))
            # ESTALE: the same as ENOENT, met on a network filesystem through a stale handle.
            # The entry is made again only if the winner's file is there (an empty entry is made
            # by name, whatever is there). RACE: that file may be removed by retention, or
            # retried, between this look and the entry: the entry is then stale, and retention
            # unlinks it after STALE_AFTER (a link meets ENOENT instead and makes nothing).
            if made and exc.errno in (errno.ENOENT, errno.ESTALE) and sc.lexists(dst):
                with contextlib.suppress(FileNotFoundError):
                    self.index_final(record, state, finished_at, dst)
            raise
        if not made:
            with contextlib.suppress(FileNotFoundError):  # removed already: it needs no entry
                self.index_final(record, state, finished_at, dst)
        self.bell("done")
        if self.durable:
            fs.sync_applied(os.path.dirname(dst), durable=True)
        return dst

    @staticmethod
    def fence_final(active: str, fresh: str) -> str | None:
        """Where a final publish is a link and an unlink (``rename_noreplace`` emulated: network
        filesystems), move the claimed file to ``fresh`` (a new name in ``active/``, of a token of
        this owner's) before the commit writes to it; the fresh name, or None if our claim was
        taken over. RACE: open() and link() go through the client's cached name to whatever file
        it names now: on GlusterFS, a link made through a name another host had renamed away an
        instant before succeeded 10 times in 10 (a rename of it 0 in 10, in a probe on the bed),
        and a holder whose claim was taken over wrote its result into the requeued job and
        published it, beside the new holder's (the three-host chaos: duplicate commits). This
        narrows that window, not closes it: once, under load, such a rename went through too
        (MULTIHOST.md). A process that dies after this rename leaves a claim of its own owner's,
        which take-over handles as any."""
        try:
            sc.rename(active, fresh)
        except FileNotFoundError:
            return None
        except StorageError as exc:
            if not exc.applied and fs.gone_after(exc, active):
                return None
            raise
        return fresh

    @staticmethod
    def unfence_final(fenced: str, claimed: str) -> None:
        """Give the claimed file its name back after a commit that failed with nothing published,
        so that the holder's retry or release finds it. A fault here as well leaves it under the
        fresh name, a claim of a live owner that no lease of this process knows: it is taken over
        once this process ends, as a dead holder's would be."""
        if fenced != claimed:
            try:
                sc.rename(fenced, claimed)
            except OSError as exc:
                log.warning("could not give %s its claimed name back: %s", fenced, exc)

    @staticmethod
    def _rename_final(path: str, dst: str) -> None:
        """``rename_noreplace``, where an EEXIST of its link() is believed only once it lasts.

        RACE: a network filesystem's client can answer link() EEXIST from its cache for a name
        another host moved away an instant before: on GlusterFS, a job failed here, retried on
        another host (its failed/ file moved out) and failed here again within the second was
        lost, its new result taken for a second copy (tests/distfs/test_multihost.py; link onto
        such a name said EEXIST 10 times in 10 at once, 4 in 10 after 0.5 s, 0 in 10 after
        1.2 s). A result really there stays there; a cached one is forgotten within the pauses.
        Where renameat2 works the answer comes from the filesystem itself: no pause."""
        for pause in (0.5, 1.0, None):
            try:
                sc.rename_noreplace(path, dst)
                return
            except FileExistsError:
                if pause is None or not sc.noreplace_emulated():
                    raise
            time.sleep(pause)

    def retain_of(self, record: Record) -> float:
        """Seconds ``record`` is kept once final (``math.inf``: forever): its own, else the
        store's recorded default."""
        return self.default_retain if record.retain is None else record.retain

    def finished_entry(self, record: Record, state: str, finished_at: float) -> str:
        """The path of ``record``'s finished-index entry, final in ``state`` at ``finished_at``."""
        fin = micros(finished_at)
        return self.layout.finished_entry(fin, expiry(fin, self.retain_of(record)), state, record.queue, record.id)

    def index_final(self, record: Record, state: str, finished_at: float, source: str) -> bool:
        """Make the finished-index entry of ``record`` final in ``state``: a hard link to
        ``source``, the job's own file, so the entry costs a name but no inode. False if it was
        there already (EEXIST: from an earlier try, or made by another host that this one's
        listing did not show yet). FileNotFoundError: ``source`` is gone. Where the filesystem
        refuses the link (no hard links, a link count at its limit, a protected_hardlinks rule),
        and on a network filesystem (below), the entry is an empty file instead, as entries
        made by older versions are: only its name is ever read."""
        entry = self.finished_entry(record, state, finished_at)
        # RACE: a network filesystem's client may resolve a name from its cache to the file it
        # named before another host moved it, and link that file (FUSE links by inode). A
        # take-over that fenced a holder then finishes with the holder's file unlinked, and the
        # holder's publish meets ENOENT; an entry linked to that file would keep it alive, and a
        # stale holder's publish (link and unlink, where renameat2 is missing) could then publish
        # it beside the job the take-over requeued: a job committed twice (tests/distfs chaos with
        # retention, 3 runs of 5). So the entry is an empty file there, made by name.
        empty = self.lagging or sc.noreplace_emulated()
        tries_left = 2
        while True:
            try:
                if empty:
                    sc.mknod(entry, self.perms.file_mode)
                else:
                    sc.link(source, entry)
                return True
            except FileExistsError:
                return False
            except FileNotFoundError:
                # The entry's bucket is missing, or the source is gone (ENOENT for either).
                # RACE: retention may rmdir an emptied bucket between our mkdir and our entry;
                # it never removes the current hour's, so a few rounds are enough.
                if not tries_left or not sc.lexists(source):
                    raise
                tries_left -= 1
                with contextlib.suppress(FileExistsError):  # the hour's first entry: its bucket made (unfsynced)
                    sc.mkdir(os.path.dirname(entry), self.perms.dir_mode)
                    if self.perms.dir_mode != fs.DIR_MODE:
                        sc.chmod(os.path.dirname(entry), self.perms.dir_mode)
            except OSError as exc:
                if empty or exc.errno not in _NO_LINK:
                    raise
                empty, tries_left = True, 2  # the link refused: an empty entry, with rounds of its own

    def index_links(self, path: str, st: os.stat_result) -> int:
        """1 if the file at ``path`` (``st``) is also the finished-index entry of the final job it
        holds, else 0: a link that holds no job (what a final file deleted by hand leaves)."""
        try:
            parsed = self.read_parsed(path)
        except (FileNotFoundError, fs.Unreadable, ValueError):
            return 0
        fin = parsed.record.finished_at
        if parsed.final is None or fin is None:
            return 0
        return 1 if fs.names_file(self.finished_entry(parsed.record, parsed.final, fin), st) else 0

    def index_unindexed(self, indexed: set[tuple[str, str]]) -> int:
        """Give each final job that is not in ``indexed`` (``(state, id)`` pairs) its finished-index
        entry; returns how many entries were made. Lists the final directories whole: for the
        upgrade from format 2 and an explicit ``recover()`` only. A file that cannot be read is
        passed over, for the quarantine of whoever reads it next."""
        made = 0
        for state, directory in self.layout.final_dirs():
            for name in fs.scan_names(directory):
                m = FINAL_RE.match(name)
                if m is None or (state, m["id"]) in indexed:
                    continue
                try:
                    record = self.read_parsed(os.path.join(directory, name)).record
                except (FileNotFoundError, fs.Unreadable, ValueError):
                    continue  # moved meanwhile, or a bad file
                if record.finished_at is None:
                    continue
                with contextlib.suppress(FileNotFoundError):  # moved meanwhile
                    made += self.index_final(record, state, record.finished_at, os.path.join(directory, name))
        return made

    def publish_found_result(self, path: str, record: Record, state: str) -> str:
        """Publish a file that already ends in a whole result line nobody published: its holder
        died, hung or lost power between the append and the rename. Its fsync may not have
        happened, so the data is made durable before the name, as the holder would have.
        Raises as :meth:`publish_final` does."""
        if self.durable:
            fd = sc.open(path, os.O_RDONLY | fs.O_NOFOLLOW | fs.O_CLOEXEC)
            try:
                sc.fsync(fd)
            finally:
                sc.close_read(fd)
        return self.publish_final(path, record, state, record.finished_at or time.time())

    def dest_path(self, record: Record, dest: str) -> str:
        lay = self.layout
        if dest == "pending":
            return lay.pending_path(record.queue, record.priority, record.seq, record.id)
        if dest == "scheduled":
            return lay.scheduled_path(record.not_before or 0.0, record.queue, record.priority,
                                      record.seq, record.id)
        if dest == "deferred":
            return lay.deferred_path(record.seq, record.queue, record.id)
        return lay.final_path(dest, record.id)

    def publish(self, tmp_path: str, record: Record, dest: str) -> str:
        """Move a complete temp file into ``dest`` durably; returns the new path.

        Final states go by :meth:`publish_final`: if a result already exists we raise
        FileExistsError instead of replacing it, so at most one result per job can ever exist.
        """
        if dest in FINAL_STATES:
            return self.publish_final(tmp_path, record, dest, record.finished_at or time.time())
        dst = self.dest_path(record, dest)
        if dest == "pending":
            self.into_pending(tmp_path, dst)
            self.bell("work")
        else:  # jobs/deferred/ too: every open makes it (_opening), in older stores as well
            self.rename_into(tmp_path, dst)
        return dst

    @staticmethod
    def unfence(fenced: str, back: str, tmp: str) -> bool:
        """Undo a commit that published nothing: rename ``fenced`` (its ``.commit`` entry, or the
        claim it was made from) back to ``back``, and only then unlink the new version ``tmp``.
        A ``.commit`` left without its temp file is taken for a published commit and dropped
        (FORMAT.md, "fail with retry"), so if the rename fails both stay (False), and recovery
        publishes the commit from the temp file."""
        try:
            sc.rename(fenced, back)
        except OSError:
            return False
        fs.unlink_quietly(tmp)
        return True

    def into_pending(self, src: str, dst: str, *, durable: bool | None = None) -> None:
        """Rename ``src`` to ``dst`` in a pending bucket (made on demand with its queue's
        directory, each fsynced into its parent when made); then the bucket is fsynced
        (``durable``: default the store's). FileNotFoundError only when ``src`` went.

        RACE: a bucket of a past second may be removed as empty (``_buckets``) between our mkdir
        and our rename, or a member may move it away; the rename then fails with ``src`` still
        here, and we make it again. A remover needs to list it empty each time, so a few rounds
        are enough; after them the caller's error (nothing moved, nothing lost)."""
        for tries_left in range(7, -1, -1):
            try:
                fs.rename_into(src, dst, durable=self.durable if durable is None else durable)
                self.note_bucket_change(dst[:dst.rfind("/")])
                return
            except OSError as exc:
                # ESTALE: a network filesystem's answer for a bucket another host removed.
                if exc.errno not in fs.GONE or getattr(exc, "applied", False):
                    raise
                if not sc.lexists(src):
                    raise FileNotFoundError(errno.ENOENT, "moved away meanwhile", src) from None
                if not tries_left:  # a fault, not "moved away": nothing moved, the caller still holds src
                    err = StorageError(exc.errno, f"its bucket was removed each time it was made: {exc.strerror}", dst)
                    err.op = "rename"
                    raise err from None
                bucket = os.path.dirname(dst)
                self.ensure_dir(os.path.dirname(bucket))
                self.ensure_dir(bucket)

    def note_bucket_change(self, bucket: str) -> None:
        """Set the queue's marker if pending bucket ``bucket`` (a path) of a past second changed
        (``_buckets.mark_changed``): ``statistics()`` then counts its buckets again."""
        _buckets.mark_changed(bucket, self.perms.file_mode, self.quarantine)

    def settle_flat(self, qdir: str, names: list[str]) -> int:
        """Move pending jobs found flat in a queue's directory (``names``: written by format 2,
        or by format 3 before buckets) into their buckets; returns how many moved."""
        touched: set[str] = set()
        moved = 0
        for name in names:
            bucket = os.path.join(qdir, bucket_of_name(name))
            try:
                # Not fsynced one by one: a move lost to a power cut leaves the job where it was,
                # flat, and the next listing moves it again.
                self.into_pending(os.path.join(qdir, name), os.path.join(bucket, name), durable=False)
            except FileNotFoundError:
                continue  # claimed meanwhile
            touched.add(bucket)
            moved += 1
        if self.durable:
            for bucket in touched:
                fs.fsync_dir(bucket)
        return moved

    # -- quarantine ----------------------------------------------------------------------------
    def quarantine(self, path: str, reason: str) -> bool:
        """Move ``path`` aside with a reason file; False if it was already gone."""
        return move_aside(self.layout, self.perms.file_mode, path, reason)


def _no_result(loc: Location, parsed: Parsed) -> bool:
    record = parsed.record
    return loc.state.is_final and parsed.final is None and (record.committed_by is None or record.finished_at is None)
