"""Bugs of the dashboard found while writing test_dashboard.py, each shown in a real browser; kept as
the tests that failed before the fix (each constant says what the bug was, and where)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("selenium", reason="browser tests need selenium: pip install -e '.[test]'")

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC

from browser.harness import Bed
from fsjobstore import JobNotFound

DEFERRED_EVENTS = """(function () {
  // The page's EventSource opens when the test says (window.__openEvents()), not at load: so a job
  // can end between the page's render and its first event, as it does by chance in real use.
  var Real = window.EventSource;
  window.EventSource = function (url, options) {
    var listeners = [], real = null;
    this.addEventListener = function (type, fn) {
      listeners.push([type, fn]);
      if (real) real.addEventListener(type, fn);
    };
    this.close = function () { if (real) real.close(); };
    window.__openEvents = function () {
      real = new Real(url, options);
      listeners.forEach(function (l) { real.addEventListener(l[0], l[1]); });
    };
  };
  // When the badge first says the job is final, by the browser's clock (kept across the reload).
  document.addEventListener("DOMContentLoaded", function () {
    var state = document.getElementById("state");
    if (!state) return;
    new MutationObserver(function () {
      if (["fulfilled", "failed", "cancelled"].indexOf(state.textContent) >= 0
          && !sessionStorage.getItem("finalBadgeAt")) sessionStorage.setItem("finalBadgeAt", String(Date.now()));
    }).observe(state, {childList: true, characterData: true, subtree: true});
  });
})();"""


SHOWN_LATE = (
    "app.js (follow, `&& !first`) does not load the page again when the first event already says the job "
    "is final: the page shows the final badge beside stale facts and actions (a Cancel button) until "
    "EventSource reconnects, 3 s later, or for good if it cannot"
)


def test_a_job_that_ends_before_its_page_follows_it_is_shown_final_at_once(bed: Bed) -> None:
    bed.web()
    job = bed.store.create({"n": 1}, queue="idle")
    b = bed.open_browser()
    b.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": DEFERRED_EVENTS})
    b.open(f"/jobs/{job.id}", "pending job")
    assert b.text("#state") == "pending" and b.driver.find_elements(By.ID, "cancel")
    bed.store.fulfill(job.id, {"done": True})
    b.js("window.__openEvents()")
    b.wait(lambda d: d.find_elements(By.XPATH, "//h2[.='Value']"), "the final job's page")
    b.shot("final page")
    late = b.js("return performance.timeOrigin - Number(sessionStorage.getItem('finalBadgeAt'))")
    assert late < 1000, f"the page said fulfilled {late / 1000:.1f} s before it showed the final job"


NESTED_SIGN_IN = (
    "app.js (refresh) puts whatever /partials/overview answers into the page: once the session no longer "
    "holds (a --token server restarted: its secret is new), the answer is the /login page it was "
    "redirected to, header and footer included, nested in the overview"
)


def test_an_overview_whose_session_ended_sends_the_browser_to_sign_in(bed: Bed) -> None:
    url = bed.web("--token", "browser-test-token-1234")
    bed.store.create({"n": 1}, queue="signed")
    b = bed.open_browser()
    b.driver.get(url)
    b.wait(lambda d: d.find_elements(By.ID, "overview"), "the overview")
    b.driver.delete_cookie("fsjobstore_session")  # as a restart of the server does to it
    b.wait(lambda d: b.path == "/login" or d.find_element(By.ID, "overview").get_attribute("data-updated"),
           "the overview's next refresh")
    b.shot("after the refresh")
    nested = b.js("return document.querySelectorAll('#overview header, #overview form[action=\"/login\"]').length")
    assert nested == 0, "the overview holds a whole sign-in page"


PURGED_UNCOUNTED = (
    "purge.html's confirm step keeps the selection editable and _pages.purge purges whatever is posted "
    "with confirm=yes: a selection changed after the count is purged without a new count, under a button "
    "that still says the old number"
)


def test_a_purge_removes_only_what_its_dry_run_counted(bed: Bed) -> None:
    bed.web()
    counted = [bed.store.create({"n": i}, queue="old") for i in range(2)]
    others = [bed.store.create({"n": i}, queue="keep") for i in range(5)]
    for job in counted + others:
        bed.store.fulfill(job.id, "done")
    b = bed.open_browser()
    b.open("/purge", "purge form")
    b.driver.find_element(By.NAME, "queue").send_keys("old")
    b.driver.find_element(By.ID, "count").click()
    b.wait(lambda d: d.find_elements(By.ID, "purge"), "the dry run's count")
    assert b.text("#purge") == "Purge 2 jobs"
    fields = b.driver.find_elements(By.CSS_SELECTOR, "main form input, main form select")
    editable = [e.get_attribute("name") for e in fields
                if e.get_attribute("type") not in ("hidden", "submit") and e.is_displayed()]
    assert editable == [], f"the confirm step lets the selection change after the count: {editable}"
    b.shot("confirm step")
    button = b.driver.find_element(By.ID, "purge")
    button.click()
    b.wait(EC.staleness_of(button), "the purge's answer")
    b.shot("after the purge")
    purged = [j.id for j in others if not _exists(bed, j.id)]
    assert not purged, f"{len(purged)} jobs never counted were purged; the page says {b.text('main')[:120]!r}"


def _exists(bed: Bed, job_id: str) -> bool:
    try:
        bed.store.get(job_id)
    except JobNotFound:
        return False
    return True


READ_ONLY_FORMS = (
    "a --read-only server still serves the forms of /new and /purge (whose buttons answer 403), though "
    "_pages.py says: with read_only no form is shown"
)


def test_a_read_only_server_offers_no_form_that_changes_the_store(bed: Bed) -> None:
    bed.web("--read-only")
    job = bed.store.create({"n": 1}, queue="kept")
    b = bed.open_browser()
    offered = {}
    for path in ("/", "/jobs", f"/jobs/{job.id}", "/new", "/purge"):
        b.open(path, path)
        offered[path] = len(b.driver.find_elements(By.CSS_SELECTOR, "main form[method=post]"))
    assert offered == dict.fromkeys(offered, 0), f"forms that change the store, by page: {offered}"


STOP_WAITS_FOR_PAGES = (
    "fsjobstore web does not stop on SIGTERM while a page follows a running job: uvicorn waits for "
    "connections to close, and /api/jobs/{id}/events ends only when the job does"
)


def test_a_server_stops_on_sigterm_while_a_running_jobs_page_is_open(bed: Bed) -> None:
    bed.web()
    job = bed.store.create({"n": 1}, queue="idle")  # pending or running: its page follows it all the same
    b = bed.open_browser()
    b.open(f"/jobs/{job.id}", "job page")
    b.wait(lambda d: d.find_element(By.ID, "job").get_attribute("data-updated"), "the page to follow the job")
    web = next(p for p in bed.procs if p.name.startswith("web"))
    began = time.monotonic()
    status = web.stop(wait=3.0)  # without a page open it takes well under a second
    assert status == 0, f"fsjobstore web ended with {status} after {time.monotonic() - began:.1f} s, not 0 within 3 s"


RETRY_BELOW_THE_FOLD = (
    "job.html put the actions (Retry, Cancel) after the whole page: on a failed job with a traceback "
    "and earlier attempts, Retry was below the first screen at 1280x900; and the last attempt's "
    "traceback was shown twice, as the error and again as the last failed attempt"
)


def test_a_failed_jobs_retry_button_is_on_the_first_screen_and_its_last_traceback_shown_once(bed: Bed) -> None:
    bed.web()
    job = bed.store.create({"file": "report.csv"}, queue="idle", max_attempts=3)
    for attempt in range(1, 4):
        lease = bed.store.pull_work(queues="idle", timeout=10)
        assert lease is not None
        trace = "Traceback (most recent call last):\n" + "".join(
            f'  File "handler.py", line {n}, in step_{n}\n' for n in range(30)) + f"OSError: disk full #{attempt}"
        lease.fail(trace, delay=0)
    assert bed.store.get(job.id).state.value == "failed"
    b = bed.open_browser(width=1280, height=900)
    b.open(f"/jobs/{job.id}", "failed job")
    b.shot("failed-job")
    top = b.js("var r = document.getElementById('retry').getBoundingClientRect(); return r.bottom;")
    assert 0 < top <= b.js("return window.innerHeight;"), RETRY_BELOW_THE_FOLD
    shown = b.js("return document.body.innerText;")
    assert shown.count("OSError: disk full #3") == 1, RETRY_BELOW_THE_FOLD
    assert shown.count("OSError: disk full #1") == 1 and shown.count("OSError: disk full #2") == 1
