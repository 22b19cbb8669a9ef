"""What operators and workers ask of each other through the directory: paused queues, cancel
requests for running jobs, and the deadlines of attempts with a time limit.

    control/paused/<queue>                 the queue is paused: no claims from it
    control/cancel/<id>.json               cancel the running job <id> ({"reason", "at"})
    control/deadlines/<DUE>.<id>.<token>   claim <token> of job <id> must end by DUE

Pauses and cancel requests are operator decisions and are made durable like jobs. A claim does
not list ``control/paused/`` each time: it asks the name watch (``Core.names``), or where there
is none it stats the directory and lists it again when that changed (see ``paused_for_claim``).
Deadlines are
hints for recovery, rewritten as leases are touched: never fsynced (a power cut can only lose
one, and then recovery falls back to the holder's heartbeat).
"""

from __future__ import annotations

import contextlib
import os
import time

from .._format._layout import CANCEL_RE, DEADLINE_RE, QUEUE_RE
from .._format._values import dumps, loads
from .._os import _files as fs
from .._os import _syscalls as sc
from ._core import Core

# The longest a claim trusts a listing of control/paused/ whose directory looks unchanged. A
# directory's mtime moves in clock ticks (and, on GlusterFS, a cached mtime is up to ~0.9 s old),
# so "unchanged" can miss a pause made in the same tick as the listing; this bounds that miss.
PAUSED_RECHECK = 1.0
# The same while the directory has not settled: its mtime could still hide a pause made in the
# tick of the listing (a few ms on a local disk), so the listing is trusted only briefly. Without
# this a store's first seconds (a cron job's whole life) listed the directory on every claim.
PAUSED_RECHECK_UNSETTLED = 0.02


class Control:
    def __init__(self, core: Core) -> None:
        self._core = core
        self._layout = core.layout
        self._tree = core.tree
        # What a claim last listed: (the directory's stat signature, trusted until (clock), names).
        # One attribute, replaced whole, so threads need no lock: at worst two of them list.
        self._paused_seen: tuple[tuple[int, int, int], float, frozenset[str]] | None = None
        # The name watch's last listing of it, and the queue names in that listing.
        self._paused_watched: tuple[frozenset[str], frozenset[str]] | None = None

    # -- pausing queues --------------------------------------------------------------------------
    def pause(self, queue: str) -> bool:
        """Mark ``queue`` paused; False if it already was."""
        path = self._layout.paused_path(queue)
        if sc.lexists(path):
            return False
        tmp = self._layout.tmp_path(self._core.new_token(), "aux", f"{queue}.paused")
        self._tree.write_new(tmp, dumps({"queue": queue, "at": self._core.wall()}) + b"\n")
        try:
            self._tree.link_into(tmp, path)
        except FileExistsError:
            return False  # paused by someone else just now
        finally:
            fs.unlink_quietly(tmp)
            self._paused_seen = None  # this process's own claims see it at once
        return True

    def resume(self, queue: str) -> bool:
        """Unpause ``queue``; False if it was not paused."""
        removed = fs.unlink(self._layout.paused_path(queue))
        self._paused_seen = None  # this process's own claims see it at once
        if not removed:
            return False
        fs.sync_applied(self._layout.paused, durable=self._core.durable)
        return True

    def paused(self) -> frozenset[str]:
        """The paused queues: one listing."""
        return frozenset(n for n in fs.scan_names(self._layout.paused) if QUEUE_RE.match(n))

    def paused_for_claim(self) -> frozenset[str]:
        """The paused queues as a claim needs them, for one stat instead of a listing (a listing
        is 4-5 system calls: round trips each on a network filesystem). Listed again when the
        directory's stat changed, when it had not settled (``_files.SETTLE``) before the last
        listing and PAUSED_RECHECK_UNSETTLED seconds passed, and at least every PAUSED_RECHECK
        seconds. So another process's pause stops this process's next claim on a local
        filesystem (but for one made within 20 ms of a listing in the same clock tick), and
        within a second where attributes are cached (FORMAT.md, "Transitions": claim). Where the
        name watch answers, its listing instead: exact, and no system call but a poll."""
        watched = self._core.names.listing(self._layout.paused)
        if watched is not None:
            last = self._paused_watched
            if last is None or last[0] is not watched:  # (the same object until a change)
                last = self._paused_watched = (watched, frozenset(n for n in watched if QUEUE_RE.match(n)))
            return last[1]
        sig, settled = self._paused_stat()
        seen, now = self._paused_seen, time.monotonic()  # real time: attribute caches age in it
        if seen is not None and seen[0] == sig and now < seen[1]:
            return seen[2]
        names = self.paused()
        self._paused_seen = (sig, now + (PAUSED_RECHECK if settled else PAUSED_RECHECK_UNSETTLED), names)
        return names

    def _paused_stat(self) -> tuple[tuple[int, int, int], bool]:
        return fs.dir_signature(self._layout.paused)

    # -- cancel requests -------------------------------------------------------------------------
    def request_cancel(self, job_id: str, reason: str | None) -> None:
        """Ask the holder of ``job_id`` (or whoever recovers it) to end it cancelled. The first
        request stands; asking again changes nothing."""
        path = self._layout.cancel_path(job_id)
        if sc.lexists(path):
            return
        tmp = self._layout.tmp_path(self._core.new_token(), "aux", f"{job_id}.cancel")
        self._tree.write_new(tmp, dumps({"reason": reason, "at": self._core.wall()}) + b"\n")
        try:
            with contextlib.suppress(FileExistsError):
                self._tree.link_into(tmp, path)
        finally:
            fs.unlink_quietly(tmp)

    def cancel_reason(self, job_id: str) -> str | None:
        """None if no cancel was requested; otherwise the text to record as the job's error."""
        path = self._layout.cancel_path(job_id)
        if not self._core.exists(path):  # the common case, on every commit: no cancel asked
            return None
        try:
            doc = loads(fs.read_regular(path, 64 * 1024))
        except FileNotFoundError:
            return None
        except (fs.Unreadable, ValueError):
            return "cancelled"
        reason = doc.get("reason") if isinstance(doc, dict) else None
        return f"cancelled: {reason}" if isinstance(reason, str) and reason else "cancelled"

    def cancel_requested(self, job_id: str) -> bool:
        return self._core.exists(self._layout.cancel_path(job_id))

    def clear_cancel(self, job_id: str) -> None:
        """Forget a request once the job is final (it has been honoured, or came too late)."""
        fs.unlink_quietly(self._layout.cancel_path(job_id))

    def cancel_requests(self) -> list[str]:
        return [m["id"] for n in fs.scan_names(self._layout.cancels) if (m := CANCEL_RE.match(n))]

    # -- deadlines -------------------------------------------------------------------------------
    def set_deadline(self, job_id: str, token: str, due: float, old: str | None = None) -> str:
        """Record that claim ``token`` must end by ``due`` (epoch seconds); returns the path.
        ``old``: the claim's previous deadline, moved rather than left behind."""
        path = self._layout.deadline_path(due, job_id, token)
        if old is not None and old != path:
            try:
                sc.rename(old, path)
                return path
            except FileNotFoundError:
                pass  # swept as stale (we were slow): make it anew
        fs.touch(path, self._tree.perms.file_mode)
        return path

    def clear_deadline(self, path: str | None) -> None:
        if path is not None:
            fs.unlink_quietly(path)

    def deadlines(self) -> list[tuple[float, str, str, str]]:
        """Every recorded deadline as (due, job id, token, path), earliest first."""
        out = []
        for name in sorted(fs.scan_names(self._layout.deadlines)):
            m = DEADLINE_RE.match(name)
            if m:
                out.append((int(m["due"]) / 1_000_000, m["id"], m["token"], os.path.join(self._layout.deadlines, name)))
        return out

