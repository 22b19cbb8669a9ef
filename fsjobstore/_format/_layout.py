"""The directory tree and the filename grammar (FORMAT.md is the contract this module implements).

Names carry what a process must know without opening the file: the sort order of pending jobs,
the due time of scheduled ones, and the claim token of active ones. Dots separate fields, which
is why ids, queue names and tokens may not contain dots.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass, field

from ._values import QUEUE_NAME_RE, QUEUE_PATTERN

FORMAT_VERSION = 3
MARKER = "fsjobstore.json"

# Priority: lower runs sooner (as in beanstalkd). Stored offset so that the
# fixed-width decimal sorts as the number does.
MIN_PRIORITY = -999_999
MAX_PRIORITY = 999_999
_PRIO_OFFSET = 1_000_000

_ID = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}"
_Q = QUEUE_PATTERN
_TOKEN = r"[0-9a-f]{16}-[0-9a-f]{1,16}"

PENDING_RE = re.compile(rf"(?P<prio>\d{{7}})\.(?P<seq>\d{{20}})\.(?P<id>{_ID})\.json\Z")
SCHEDULED_RE = re.compile(
    rf"(?P<due>\d{{17}})\.(?P<queue>{_Q})\.(?P<prio>\d{{7}})\.(?P<seq>\d{{20}})\.(?P<id>{_ID})\.json\Z"
)
ACTIVE_RE = re.compile(rf"(?P<id>{_ID})\.(?P<token>{_TOKEN})\.(?P<kind>json|commit|recover)\Z")
FINAL_RE = re.compile(rf"(?P<id>{_ID})\.json\Z")
# A job waiting for its parents (create(after=...)): jobs/deferred/<SEQ>.<queue>.<id>.json.
DEFERRED_RE = re.compile(rf"(?P<seq>\d{{20}})\.(?P<queue>{_Q})\.(?P<id>{_ID})\.json\Z")
# A job waiting for a slot or a start of its limit (_limit_gate): jobs/waiting/<H>.<P>.<SEQ>.<queue>.<id>.json.
WAITING_RE = re.compile(
    rf"(?P<limit>[0-9a-f]{{16}})\.(?P<prio>\d{{7}})\.(?P<seq>\d{{20}})\.(?P<queue>{_Q})\.(?P<id>{_ID})"
    rf"(?:\.(?P<token>{_TOKEN}))?\.json\Z"  # the parking claim's token (names before it had none)
)
LIMIT_RE = re.compile(r"(?P<limit>[0-9a-f]{16})\.json\Z")  # control/limits/<H>.json
DEP_RE = re.compile(rf"(?P<id>{_ID})\Z")  # deps/<parent>/<child>, and deps/<parent> itself
DEADLINE_RE = re.compile(rf"(?P<due>\d{{17}})\.(?P<id>{_ID})\.(?P<token>{_TOKEN})\Z")
CANCEL_RE = re.compile(rf"(?P<id>{_ID})\.json\Z")
QUEUE_RE = QUEUE_NAME_RE  # the one rule (_values.check_queue_name)
RUN_RE = re.compile(rf"(?P<token>{_TOKEN})\.jsonl\Z")
BELL_RE = re.compile(r"(?P<owner>[0-9a-f]{16})\.(?P<kind>work|done)\.(?P<n>[0-9a-f]{1,16})\Z")
EAR_RE = re.compile(r"(?P<owner>[0-9a-f]{16})\.ear\.(?P<kind>done)\Z")  # a process that waits for results
WORKER_RE = re.compile(r"(?P<owner>[0-9a-f]{16})\.json\Z")
GENERATED_ID_RE = re.compile(r"[0-9a-f]{32}\Z")  # what create() makes up (generated_id; uuid4 before)
TARGET_RE = re.compile(r"(?P<key>[0-9a-f]{32})\.json\Z")
OWNER_RE = re.compile(r"(?P<owner>[0-9a-f]{16})\.owner\Z")
NOTIFY_LOCK_RE = re.compile(rf"(?P<id>{_ID})\.notify\Z")
TMP_RE = re.compile(rf"(?P<token>{_TOKEN})\.(?P<purpose>new|newid|commit|aux|gone)\.(?P<rest>.+)\Z")
# The finished index (FORMAT.md, "Tree"): finished/<B>/<FIN>.<EXP>.<state>.<queue>.<id>, a link to
# the job's file.
FINISHED_RE = re.compile(
    rf"(?P<fin>\d{{17}})\.(?P<exp>\d{{17}})\.(?P<state>fulfilled|failed|cancelled)\.(?P<queue>{_Q})\.(?P<id>{_ID})\Z"
)
# The same names, found all at once in a bucket's names joined by NUL (the one byte no name holds),
# each whole between NULs: a pending job's <SEQ>, a final job's state and queue (for counting).
PENDING_NAMES_RE = re.compile(rf"(?<![^\0])\d{{7}}\.(\d{{20}})\.{_ID}\.json(?![^\0])")
FINISHED_NAMES_RE = re.compile(
    rf"(?<![^\0])\d{{17}}\.\d{{17}}\.(fulfilled|failed|cancelled)\.({_Q})\.{_ID}(?![^\0])")
BUCKET_RE = re.compile(r"\d{10}\Z")
# A pending queue's bucket (FORMAT.md, "Tree"): pending/<queue>/<P>.<S>/, S the second of creation.
PENDING_BUCKET_RE = re.compile(r"(?P<prio>\d{7})\.(?P<sec>\d{11})\Z")
SEQ_PER_BUCKET = 1_000_000_000  # one bucket per priority and second of <SEQ> (ns)
FOREVER = 99_999_999_999_999_999  # <EXP> of a job kept forever: later than any time a field can hold
BUCKET_US = 3_600_000_000  # one bucket of the finished index per hour of finishing


@dataclass(frozen=True, slots=True)
class Layout:
    """Absolute paths of one store's directories, joined once (they are on every hot path)."""

    root: str
    marker: str = field(init=False)
    jobs: str = field(init=False)  # the watched subtree: every routine move stays inside it
    pending: str = field(init=False)
    scheduled: str = field(init=False)
    deferred: str = field(init=False)  # jobs waiting for their parents (made when first used; _deps)
    waiting: str = field(init=False)  # jobs waiting for a slot or a start of a limit (made when first used; _gate)
    active: str = field(init=False)
    fulfilled: str = field(init=False)
    failed: str = field(init=False)
    cancelled: str = field(init=False)
    notify: str = field(init=False)
    targets: str = field(init=False)
    control: str = field(init=False)  # what operators and workers ask of each other
    paused: str = field(init=False)
    doorbell: str = field(init=False)
    cancels: str = field(init=False)
    schedules: str = field(init=False)  # periodic schedules and their ticks (made when first used)
    metrics: str = field(init=False)  # counters every process adds to (made when first used; _counters)
    limit_decls: str = field(init=False)  # control/limits/<H>.json: declared limits (made when first used)
    deadlines: str = field(init=False)
    runs: str = field(init=False)  # progress and logs of each claim
    workers: str = field(init=False)
    leases: str = field(init=False)
    ids: str = field(init=False)
    unique: str = field(init=False)  # unique keys' entries (made by every open: all_dirs; _unique)
    deps: str = field(init=False)  # deps/<parent>/<child>: who waits for whom (made by every open; _deps)
    groups: str = field(init=False)  # groups/<gid>.json: the jobs made together (made when first used; _groups)
    limits: str = field(init=False)  # limits/<H>/: a limit's slots and start tickets (made when first used; _gate)
    tmp: str = field(init=False)
    quarantine: str = field(init=False)
    finished: str = field(init=False)  # the finished index (retention and listings walk it)

    def __post_init__(self) -> None:
        def put(name: str, path: str) -> None:
            object.__setattr__(self, name, path)

        put("marker", os.path.join(self.root, MARKER))
        put("jobs", os.path.join(self.root, "jobs"))
        for sub in ("pending", "scheduled", "deferred", "waiting", "active", "fulfilled", "failed", "cancelled",
                    "notify"):
            put(sub, os.path.join(self.jobs, sub))
        for sub in ("targets", "control", "runs", "workers", "leases", "ids", "unique", "deps", "groups", "limits",
                    "tmp", "quarantine", "finished"):
            put(sub, os.path.join(self.root, sub))
        for sub in ("paused", "deadlines", "doorbell"):
            put(sub, os.path.join(self.control, sub))
        put("cancels", os.path.join(self.control, "cancel"))
        put("schedules", os.path.join(self.control, "schedules"))
        put("metrics", os.path.join(self.control, "metrics"))
        put("limit_decls", os.path.join(self.control, "limits"))

    def all_dirs(self) -> tuple[str, ...]:
        """Every directory of the skeleton, parents first."""
        return (
            self.jobs, self.pending, self.scheduled, self.deferred, self.active, self.fulfilled, self.failed,
            self.cancelled, self.notify, self.targets, self.control, self.paused, self.cancels,
            self.deadlines, self.doorbell, self.runs, self.workers, self.leases, self.ids, self.tmp, self.quarantine,
            self.finished,
            # Made before any create can need it: two hosts making it at once for their first keys
            # left GlusterFS clients answering ENOENT for it, then two jobs for one key (6 runs in
            # 39 of test_relations_hosts' first test; 0 in 18 with it made first).
            self.unique,
            # Every commit of a final job looks for deps/<id> (who waits for it): made here, it is
            # looked up through a kept descriptor instead of a failing resolution of deps/ each time.
            self.deps,
        )

    def final_dirs(self) -> tuple[tuple[str, str], ...]:
        """(state, directory) of each final state."""
        return (("fulfilled", self.fulfilled), ("failed", self.failed), ("cancelled", self.cancelled))

    # -- names -------------------------------------------------------------------------------
    def pending_dir(self, queue: str) -> str:
        return os.path.join(self.pending, queue)

    def pending_marker(self, qdir: str) -> str:
        """The file whose times say an older bucket of the queue at ``qdir`` changed (``_stats``)."""
        return f"{qdir}/{PENDING_MARKER}"

    def pending_path(self, queue: str, priority: int, seq: str, job_id: str) -> str:
        return f"{self.pending}/{queue}/{pending_rel(priority, seq, job_id)}"

    def scheduled_path(self, due: float, queue: str, priority: int, seq: str, job_id: str) -> str:
        name = f"{due_field(due)}.{queue}.{prio_field(priority)}.{seq}.{job_id}.json"
        return os.path.join(self.scheduled, name)

    def deferred_path(self, seq: str, queue: str, job_id: str) -> str:
        return f"{self.deferred}/{seq}.{queue}.{job_id}.json"

    def waiting_path(self, limit: str, priority: int, seq: str, queue: str, job_id: str, token: str) -> str:
        return f"{self.waiting}/{limit}.{prio_field(priority)}.{seq}.{queue}.{job_id}.{token}.json"

    def limit_dir(self, limit: str) -> str:
        return f"{self.limits}/{limit}"

    def limit_decl(self, limit: str) -> str:
        return f"{self.limit_decls}/{limit}.json"

    def dep_dir(self, parent: str) -> str:
        return f"{self.deps}/{parent}"

    def dep_path(self, parent: str, child: str) -> str:
        return f"{self.deps}/{parent}/{child}"

    def group_path(self, gid: str) -> str:
        return f"{self.groups}/{gid}.json"

    def active_path(self, job_id: str, token: str, kind: str = "json") -> str:
        return f"{self.active}/{job_id}.{token}.{kind}"

    def final_path(self, state: str, job_id: str) -> str:
        directory = {"fulfilled": self.fulfilled, "failed": self.failed, "cancelled": self.cancelled}[state]
        return f"{directory}/{job_id}.json"

    def notify_path(self, job_id: str) -> str:
        return f"{self.notify}/{job_id}.json"

    def target_dir(self, job_id: str) -> str:
        return f"{self.targets}/{job_id}"

    def owner_path(self, owner: str) -> str:
        return os.path.join(self.leases, f"{owner}.owner")

    def notify_lock_path(self, job_id: str) -> str:
        return os.path.join(self.leases, f"{job_id}.notify")

    def id_marker(self, job_id: str) -> str:
        return f"{self.ids}/{job_id}"  # an f-string: a commit asks this twice (os.path.join is ~1 us)

    def schedule_path(self, name: str) -> str:
        return os.path.join(self.schedules, f"{name}.json")

    def ticks_dir(self, name: str) -> str:
        return os.path.join(self.schedules, name)

    def paused_path(self, queue: str) -> str:
        return os.path.join(self.paused, queue)

    def cancel_path(self, job_id: str) -> str:
        return f"{self.cancels}/{job_id}.json"

    def deadline_path(self, due: float, job_id: str, token: str) -> str:
        return os.path.join(self.deadlines, f"{due_field(due)}.{job_id}.{token}")

    def run_dir(self, job_id: str) -> str:
        return os.path.join(self.runs, job_id)

    def run_path(self, job_id: str, token: str) -> str:
        return os.path.join(self.runs, job_id, f"{token}.jsonl")

    def worker_path(self, owner: str) -> str:
        return os.path.join(self.workers, f"{owner}.json")

    def tmp_path(self, token: str, purpose: str, rest: str) -> str:
        return os.path.join(self.tmp, f"{token}.{purpose}.{rest}")

    def gone_tmp_path(self, token: str, job_id: str) -> str:
        """A job being removed (``_removal``): fenced here, then its other files go, then this."""
        return self.tmp_path(token, "gone", f"{job_id}.json")

    def finished_bucket(self, bucket: str) -> str:
        return f"{self.finished}/{bucket}"

    def finished_entry(self, fin: int, exp: int, state: str, queue: str, job_id: str) -> str:
        """The finished-index entry of a final job: ``fin`` and ``exp`` in µs (see FORMAT.md)."""
        return f"{self.finished}/{bucket_field(fin)}/{fin:017d}.{exp:017d}.{state}.{queue}.{job_id}"

    def boot_marker(self) -> str:
        """``control/boot-<boot id>``: this boot's deep pass was made (``_power_loss``), or the store
        was made during this boot, so no earlier power cut can have emptied its files."""
        try:
            with open("/proc/sys/kernel/random/boot_id") as fh:
                boot = fh.read().strip().replace("-", "")
        except OSError:
            boot = "unknown"  # no boot id: never marked, so every first pass is deep
        return os.path.join(self.control, f"boot-{boot[:32]}")

    def commit_tmp_path(self, token: str, job_id: str, dest: str) -> str:
        """The new version of a job being committed by claim ``token`` (recovery finishes it)."""
        return self.tmp_path(token, "commit", f"{job_id}.{dest}.json")


def prio_field(priority: int) -> str:
    return f"{priority + _PRIO_OFFSET:07d}"


def prio_value(field: str) -> int:
    return int(field) - _PRIO_OFFSET


def due_field(due: float) -> str:
    """Due time as whole microseconds since the epoch, fixed width so names sort by time."""
    return f"{max(0, int(due * 1_000_000)):017d}"


def micros(at: float) -> int:
    """Epoch seconds as whole µs (the <DUE> and <FIN> fields), never negative."""
    return max(0, int(at * 1_000_000))


def expiry(fin: int, retain: float) -> int:
    """<EXP>: when retention may remove a job that finished at ``fin`` µs and is kept ``retain``
    seconds (``math.inf``: forever)."""
    if retain == float("inf"):
        return FOREVER
    return min(FOREVER, fin + int(retain * 1_000_000))


def bucket_field(fin: int) -> str:
    """<B>: the hour of finishing, since the epoch, 10 digits."""
    return f"{fin // BUCKET_US:010d}"


def seq_field(created_ns: int) -> str:
    return f"{created_ns:020d}"


def pending_name(priority: int, seq: str, job_id: str) -> str:
    return f"{prio_field(priority)}.{seq}.{job_id}.json"


PENDING_MARKER = ".changed"  # in a queue's directory: see Layout.pending_marker


def pending_bucket(prio: str, seq: str) -> str:
    """<P>.<S>: the bucket of a pending name with priority field ``prio`` and <SEQ> ``seq``."""
    return f"{prio}.{int(seq) // SEQ_PER_BUCKET:011d}"


def pending_rel(priority: int, seq: str, job_id: str) -> str:
    """A pending job's path below its queue's directory: ``<P>.<S>/<P>.<SEQ>.<id>.json``."""
    prio = prio_field(priority)
    return f"{prio}.{int(seq) // SEQ_PER_BUCKET:011d}/{prio}.{seq}.{job_id}.json"


def bucket_of_name(name: str) -> str:
    """The bucket a pending file's name (``PENDING_RE``) belongs in."""
    return pending_bucket(name[:7], name[8:28])


def generated_id(seq: str) -> str:
    """A new generated id: its <SEQ> in 16 hex digits, then 63 random bits (16 hex digits, the
    first 0-7). Lookups by id find a pending job's bucket from it (:func:`seq_of_generated`);
    ids made by versions before buckets (uuid4: 13th digit 4, 17th 8-b) never have that shape."""
    return f"{int(seq):016x}{secrets.randbits(63):016x}"


def seq_of_generated(job_id: str) -> str | None:
    """The <SEQ> a generated id (:func:`generated_id`) begins with, or None for any other id."""
    if len(job_id) != 32 or job_id[16] not in "01234567" or not GENERATED_ID_RE.match(job_id):
        return None
    return seq_field(int(job_id[:16], 16))


def token_owner(token: str) -> str:
    return token.split("-", 1)[0]
