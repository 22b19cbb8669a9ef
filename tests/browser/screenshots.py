"""Screenshots of the dashboard on a realistic demo store: ``python tests/browser/screenshots.py OUTDIR``.

Builds a store in a temporary directory (queues ``images``, ``emails``, ``reports``, ``digest`` and a
paused ``exports``; jobs in every state; two real workers, one running a long report with progress
and log lines; an hourly schedule that has ticked and a nightly one that has not), serves it with
``fsjobstore web``, and saves from headless Chromium (1280 x 800 unless said):

    overview.png  jobs.png  job-running.png  job-failed.png  new.png  purge.png  api-docs.png
    overview-dark.png  overview-narrow.png (420 x 900)

Needs what the browser tests need (tests/browser/install.sh). Takes about 20 s.
"""

from __future__ import annotations

import sys
import tempfile
import textwrap
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the browser package

from browser.harness import Bed, missing, resize

DEMO = textwrap.dedent('''
    """The demo's handlers: images resized, emails sent, reports rendered, digests made."""
    import time


    def _work(job, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            job.raise_if_cancelled()
            time.sleep(0.05)


    def resize(job):
        image = job.request["image"]
        if image.endswith(".heic"):
            raise ValueError(f"cannot decode {image}: HEIC is not supported (convert it to PNG or JPEG)")
        job.log(f"resizing {image} to {job.request['width']} px")
        _work(job, 0.1)
        return {"image": image.replace(".png", f"-{job.request['width']}.png"), "bytes": 48213}


    def send(job):
        to = job.request["to"]
        if to.endswith(".invalid"):
            raise ConnectionError(f"SMTPRecipientsRefused: {to}: 550 5.1.1 mailbox unavailable")
        _work(job, 0.05)
        return {"to": to, "message_id": f"<{job.id[:12]}@mail.example.com>"}


    def render(job):
        pages = int(job.request.get("pages", 40))
        job.log(f"rendering the {job.request['report']} report for {job.request['month']}: {pages} pages")
        for page in range(1, pages + 1):
            _work(job, float(job.request.get("seconds_per_page", 0.1)))
            job.progress(page, pages, f"page {page} of {pages}")
            if page % 3 == 0:
                job.log(f"page {page}: {page * 137} rows, {page * 3} charts")
        return {"pdf": f"reports/{job.request['report']}-{job.request['month']}.pdf", "pages": pages}


    def digest(job):
        return {"sent_to": 3}


    handlers = {"images": resize, "emails": send, "reports": render, "digest": digest}
''')


def build(bed: Bed) -> dict[str, str]:
    """The demo store, its workers running; returns the ids of the jobs the screenshots show."""
    from fsjobstore.schedule import Schedule

    (bed.root / "demo_tasks.py").write_text(DEMO)
    store = bed.store
    names = ["cat", "harbour", "mountains", "team-photo", "receipt", "whiteboard", "garden", "bicycle"]
    for i in range(18):
        store.create({"image": f"uploads/{names[i % 8]}-{i:04d}.png", "width": (320, 640, 1280)[i % 3]},
                     queue="images")
    for i in range(12):
        store.create({"to": f"user{i}@example.com", "template": "welcome"}, queue="emails")
    bounced = store.create({"to": "old.address@company.invalid", "template": "invoice"}, queue="emails",
                           max_attempts=2)
    store.create({"image": "uploads/IMG_2231.heic", "width": 640}, queue="images", max_attempts=1)
    for i in range(3):
        store.create({"to": f"newsletter-{i}@example.com", "template": "newsletter"}, queue="emails",
                     delay=3600 * (i + 1))
    for i in range(2):
        gone = store.create({"image": f"uploads/duplicate-{i}.png", "width": 640}, queue="images")
        store.cancel(gone.id, "uploaded twice")
    store.pause("exports")
    for i in range(7):
        store.create({"export": "csv", "table": ("orders", "customers", "invoices")[i % 3], "month": "2026-10"},
                     queue="exports")

    schedule = Schedule()
    schedule.every(timedelta(hours=1), queue="digest", request={"digest": "hourly"}, name="hourly-digest",
                   start=int(time.time()) + 1)
    schedule.cron("0 3 * * *", tz="Europe/Paris", queue="reports", name="nightly-report",
                  request={"report": "nightly", "month": "2026-11"})
    schedule.declare(store)

    bed.worker("--queue", "images", "--queue", "emails", "--queue", "digest", "--concurrency", "3",
               "--name", "web-1:images+emails", handlers="demo_tasks:handlers")
    bed.worker("--queue", "reports", "--name", "reports-1", handlers="demo_tasks:handlers")
    report = store.create({"report": "monthly-revenue", "month": "2026-10", "pages": 400, "seconds_per_page": 0.4},
                          queue="reports")
    time.sleep(1.2)
    schedule.run_pending(store)  # the hourly digest's first tick

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stats = store.statistics()
        running = store.get(report.id)
        if (stats.by_queue.get("images", {}).get("pending", 1) == 0
                and stats.by_queue.get("emails", {}).get("pending", 1) == 0
                and store.get(bounced.id).state.value == "failed"
                and running.progress is not None and running.progress.done >= 9):
            break
        time.sleep(0.2)
    else:
        raise SystemExit(f"the demo store did not settle:\n{bed.output()}")
    failed = next(j for j in store.jobs(state="failed", queue="emails"))
    return {"running": report.id, "failed": failed.id}


def main(out: Path) -> None:
    reason = missing()
    if reason is not None:
        raise SystemExit(f"screenshots need a browser: {reason}")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fsjobstore-demo-") as tmp:
        bed = Bed(Path(tmp) / "demo", out, "demo")
        try:
            bed.prelaunch()
            ids = build(bed)
            bed.web()
            b = bed.open_browser(1280, 800)
            driver = b.driver

            def save(name: str) -> None:
                time.sleep(0.3)  # the page's own script settles (a live update, the theme)
                driver.save_screenshot(str(out / f"{name}.png"))
                print(f"{out / name}.png")

            b.driver.get(b.url("/"))
            save("overview")
            b.driver.get(b.url("/jobs"))
            save("jobs")
            b.driver.get(b.url(f"/jobs/{ids['running']}"))
            b.wait(lambda d: "page" in b.text("#progress-text"), "the report's progress")
            save("job-running")
            b.driver.get(b.url(f"/jobs/{ids['failed']}"))
            save("job-failed")

            b.driver.get(b.url("/new?queue=images"))
            request = driver.find_element("name", "request")
            request.clear()
            request.send_keys('{"image": "uploads/sunset.png", "width": 1280}')
            driver.find_element("name", "max_attempts").send_keys("5")
            driver.find_element("name", "timeout").send_keys("2m")
            driver.execute_script("document.activeElement.blur()")
            save("new")

            b.driver.get(b.url("/purge"))
            driver.find_element("id", "count").click()
            b.wait(lambda d: d.find_elements("id", "purge"), "the purge's count")
            save("purge")

            b.driver.get(b.url("/api/docs"))
            save("api-docs")

            b.driver.get(b.url("/"))
            driver.find_element("id", "theme").click()
            save("overview-dark")
            driver.find_element("id", "theme").click()  # back to light

            resize(driver, 420, 900)
            b.driver.get(b.url("/"))
            save("overview-narrow")
        finally:
            bed.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
