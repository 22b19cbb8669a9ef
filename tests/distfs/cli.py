"""The bed's command line, run as `python tests/distfs/gluster.py up|selftest`.

up: start the bed with two DEFAULT mounts, print their paths and PIDs, clean up on Ctrl-C or SIGTERM.
selftest: start the bed, check that it stands in for two hosts, confirm or refute the cross-mount facts in
README.md, measure rates, clean up. Exit 0 if the bed itself works.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import gluster
import probes

RATE_SECONDS = 3.0


class Report:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def check(self, name: str, ok: bool, detail: str = "", essential: bool = True) -> None:
        """essential: the bed is broken if this fails; otherwise a fact about GlusterFS, CONFIRMED or REFUTED."""
        word = ("ok" if ok else "FAIL") if essential else ("CONFIRMED" if ok else "REFUTED")
        print(f"  {word:9} {name}{': ' + detail if detail else ''}", flush=True)
        if essential and not ok:
            self.failed.append(name)


def _fresh(a: Path, b: Path, name: str) -> tuple[Path, Path]:
    (a / name).mkdir()
    return a / name, b / name


def _bed_checks(bed: gluster.GlusterBed, r: Report) -> None:
    ma, mb = bed.mounts["a"], bed.mounts["b"]
    a, b = _fresh(ma.path, mb.path, "checks")
    (a / "hello").write_text("from A")
    r.check("a file created through A is read through B", (b / "hello").read_text() == "from A")
    race = probes.rename_race(a, b, 300)
    r.check("a rename race has exactly one winner", race["one_winner"] == 300, str(race))
    for kind in ("flock", "lockf"):
        with probes.LockHolder(a / f"{kind}.lock", kind) as holder:
            r.check(f"{kind} through A excludes {kind} through B", not probes.try_lock(b / f"{kind}.lock", kind))
            holder.kill()
            freed = probes.seconds_until_lockable(b / f"{kind}.lock", kind, 10.0)
        r.check(f"SIGKILL of the {kind} holder on A frees it for B", freed is not None,
                f"after {freed * 1000:.1f} ms" if freed is not None else "not within 10 s", essential=False)
    seen = probes.inotify_names(b, lambda: (a / "made-by-a").write_text("x"))
    own = probes.inotify_names(b, lambda: (b / "made-by-b").write_text("x"))
    r.check("inotify on B sees nothing done through A", "made-by-a" not in seen and "made-by-b" in own,
            f"through A: {seen}, through B itself: {own}", essential=False)
    with probes.LockHolder(a / "hung.lock") as holder:
        ma.stop()
        holder.kill(wait=False)
        time.sleep(5.0)
        kept = not probes.try_lock(b / "hung.lock")
        ma.cont()
        freed = probes.seconds_until_lockable(b / "hung.lock", "flock", 10.0)
    r.check("a hung client keeps its locks (5 s; freed on SIGCONT)", kept and freed is not None,
            f"freed {freed * 1000:.0f} ms after SIGCONT" if freed is not None else "", essential=False)
    ma.stop()
    hangs = not probes.answers_within(a / "probe", 2.0)
    (b / "while-a-hangs").write_text("B works")
    b_works = (b / "while-a-hangs").read_text() == "B works"
    ma.cont()
    r.check("SIGSTOP of A's client hangs A, B keeps working, SIGCONT brings A back",
            hangs and b_works and probes.answers_within(a / "probe", 5.0))
    old = ma.pid
    ma.kill()
    try:
        os.listdir(a)  # not os.stat: the kernel may answer that from its attribute cache
        seen = "listdir succeeded"
    except OSError as exc:
        seen = errno.errorcode.get(exc.errno or 0, str(exc))
    ma.remount()
    back = (a / "hello").read_text() == "from A"
    r.check("SIGKILL of A's client: ENOTCONN, then remount works", seen == "ENOTCONN" and ma.pid != old and back,
            f"after SIGKILL: {seen}; pid {old} -> {ma.pid}; file read after remount: {back}")
    (a / "src").write_text("x")
    code = probes.rename_noreplace(a / "src", a / "dst")
    r.check("renameat2(RENAME_NOREPLACE) fails with EINVAL", code == errno.EINVAL,
            errno.errorcode.get(code, "succeeded"), essential=False)
    os.link(a / "src", a / "dst")
    os.unlink(a / "src")
    try:
        os.link(a / "hello", b / "dst")
        refused = False
    except FileExistsError:
        refused = True
    r.check("link+unlink works as the no-replace fallback (EEXIST through B)", refused, essential=False)


def _mount_pairs(bed: gluster.GlusterBed, presets: tuple[str, ...]) -> dict[str, tuple[Path, Path]]:
    """A fresh (writer, reader) directory pair per preset, each through its own two new mounts."""
    pairs = {}
    for preset in presets:
        x = bed.mounts.get(f"{preset}-x") or bed.mount(f"{preset}-x", getattr(gluster, preset))
        y = bed.mounts.get(f"{preset}-y") or bed.mount(f"{preset}-y", getattr(gluster, preset))
        pairs[preset] = _fresh(x.path, y.path, f"d-{time.monotonic_ns()}")
    return pairs


def _cache_checks(bed: gluster.GlusterBed, r: Report, volume: str) -> None:
    md_cache_off = bed.volume_options.get("performance.stat-prefetch") == "off"
    for preset, (w, rd) in _mount_pairs(bed, ("DEFAULT", "STRICT", "UNSAFE")).items():
        cap = 3.0 if md_cache_off and preset != "STRICT" else 10.0  # these can stay stale for good
        lags = [round(x) for x in probes.rewrite_lags_ms(w, rd, rounds=1 if cap < 10 else 3, timeout=cap)]
        grow = [round(x or -1) for x in (probes.staleness_ms(w, rd) for _ in range(3))]
        capped = f" (gave up after {cap:.0f} s)" if max(lags) >= cap * 1000 else ""
        print(f"  {volume}, {preset:7} mounts: B read A's pwrite after {lags} ms{capped}, "
              f"saw A's append after {grow} ms", flush=True)
        fresh = max(lags) < 100 and max(grow) < 100
        if preset == "STRICT":
            r.check(f"{volume}: STRICT mounts see rewritten contents and sizes at once", fresh, essential=False)
        elif preset == "UNSAFE":
            r.check(f"{volume}: UNSAFE mounts read rewritten contents stale", max(lags) > 100, essential=False)
        else:
            r.check(f"{volume}: DEFAULT mounts are stale for about 1 s at most", 500 < max(lags + grow) < 1500,
                    essential=False)
    if not md_cache_off:
        for preset, (w, rd) in _mount_pairs(bed, ("DEFAULT", "STRICT")).items():
            outcome = probes.replace_while_open(w, rd, 3.0)
            r.check(f"{preset} mounts: replacing a name through A while B opens it gives B ESTALE",
                    outcome.get("ESTALE", 0) > 0, str(outcome), essential=False)


def _rates(bed: gluster.GlusterBed, presets: tuple[str, ...] = ("DEFAULT", "STRICT"), local: bool = True) -> None:
    here = Path(tempfile.mkdtemp(prefix="local-", dir=gluster.BASE))
    try:
        rows = [(f"local disk ({gluster.BASE})", [here], [here])] if local else []
        rows += [(f"{preset} mounts", [pa], [pa, pb]) for preset, (pa, pb) in _mount_pairs(bed, presets).items()]
        for label, single, pair in rows:
            r1, r2 = probes.create_rate(single, RATE_SECONDS), probes.create_rate(pair, RATE_SECONDS)
            print(f"  {label:40} one process: {r1:7,.0f}/s   two processes (one per mount; local: one dir): "
                  f"{r2:7,.0f}/s", flush=True)
    finally:
        shutil.rmtree(here, ignore_errors=True)


def selftest() -> int:
    reason = gluster.available()
    if reason is not None:
        print(f"distfs selftest: cannot run: {reason}")
        return 1
    r = Report()
    print(f"distfs selftest {datetime.date.today()}, {os.cpu_count()} cores", flush=True)
    t0 = time.monotonic()
    runs = []
    with gluster.GlusterBed() as bed:
        runs.append(bed.run)
        t1 = time.monotonic()
        bed.mount("a")
        bed.mount("b")
        pids = f"brick {bed.brick_pid}, clients {bed.mounts['a'].pid} {bed.mounts['b'].pid}"
        print(f"cold start: glusterd + volume {bed.cold_start_s:.1f} s, two mounts {time.monotonic() - t1:.1f} s "
              f"more ({pids})", flush=True)
        print("the bed:", flush=True)
        _bed_checks(bed, r)
        print("caches and replaced names:", flush=True)
        _cache_checks(bed, r, "volume defaults")
        print(f"create+write(200 B)+close+rename, no fsync, {RATE_SECONDS:.0f} s each:", flush=True)
        _rates(bed)
    print(f"a second bed, with {gluster.STRICT_VOLUME}:", flush=True)
    with gluster.GlusterBed(gluster.STRICT_VOLUME) as bed2:
        runs.append(bed2.run)
        print(f"  cold start {bed2.cold_start_s:.1f} s", flush=True)
        _cache_checks(bed2, r, "md-cache off")
        _rates(bed2, ("STRICT",), local=False)
    left = [f"pid {pid}" for run in runs for pid in gluster.processes_of(run)]
    left += [point for run in runs for point in gluster.mounts_under(run)] + [str(p) for p in runs if p.exists()]
    r.check("nothing left behind after cleanup (processes, mounts, directories)", not left, ", ".join(left))
    print(f"selftest {'FAILED: ' + ', '.join(r.failed) if r.failed else 'passed'} in {time.monotonic() - t0:.0f} s")
    return 1 if r.failed else 0


def up() -> int:
    reason = gluster.available()
    if reason is not None:
        print(f"distfs: cannot start: {reason}")
        return 1
    for signum in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a shell's background job starts with it ignored
        signal.signal(signum, signal.default_int_handler)
    with gluster.GlusterBed() as bed:
        print(f"glusterd up in {bed.cold_start_s:.1f} s; volume {gluster.VOLUME} on {bed.host}:{bed.run / 'brick'}")
        for name in ("a", "b"):
            mount = bed.mount(name)
            print(f"mount {name}: {mount.path}  (FUSE client pid {mount.pid})", flush=True)
        print("Ctrl-C or SIGTERM to stop and clean up", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                signal.pause()
        print("stopping: unmounting, stopping glusterd, removing the bed's files", flush=True)
    print("stopped", flush=True)
    return 0
