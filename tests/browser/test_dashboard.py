"""The dashboard (``fsjobstore web``) in a real browser: headless Chromium, driven through Selenium,
against a real server and a real worker in subprocesses, each test on a store of its own.

What a user does, click by click: follow a running job live and cancel it, retry a failed one,
pause and resume a queue, create a job, purge, sign in with the token; and what must never happen:
a job's text running as script, a page wider than a phone's window. Every step leaves a screenshot
(conftest.py says where). Waits poll every 0.1 s; nothing sleeps for long. The bugs found on the way
are shown in test_dashboard_bugs.py."""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import quote

import pytest

pytest.importorskip("selenium", reason="browser tests need selenium: pip install -e '.[test]'")

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC

from browser.harness import Bed, Browser, job_json
from fsjobstore import JobNotFound, JobState

SCRIPT = "<script>window.__xss = 1</script>"
IMG = '<img src=x onerror="window.__xss=2">'
COLUMNS = ("queue", "pending", "scheduled", "active", "fulfilled", "failed", "cancelled")


# -- what the tests read off the pages ----------------------------------------------------------------
# The overview's middle is replaced every 3 s (app.js): what is read there is read in one script call,
# and what is clicked there is found again if a refresh replaced it (Browser.click).
QUEUE_ROW = """
for (const row of document.querySelectorAll("table.queues > tbody > tr")) {
  const link = row.querySelector("td a");
  if (!link || link.textContent.trim() !== arguments[0]) continue;
  const button = row.querySelector("button[data-action]");
  return {cells: Array.from(row.cells, (cell) => cell.textContent.trim()),
          button: button ? button.textContent.trim() : null, paused: row.querySelector(".badge.paused") !== null};
}
return null;
"""


def queue_view(b: Browser, name: str) -> dict[str, Any]:
    """The overview's row of queue ``name``: its numbers by column (hidden ones too), the text of
    its button, and whether it says paused."""
    row = b.js(QUEUE_ROW, name)
    assert row is not None, f"the overview has no row for queue {name}"
    view: dict[str, Any] = dict(zip(COLUMNS, row["cells"], strict=False))
    view.update(button=row["button"], paused=row["paused"])
    return view


def queue_xpath(name: str, inside: str = "") -> str:
    return f"//table[contains(@class, 'queues')]/tbody/tr[td[1]/a[.='{name}']]{inside}"


def flash(b: Browser) -> str:
    return b.text("p.flash")


def log_lines(b: Browser) -> list[str]:
    """The job page's log, read at once (a live update rebuilds the list)."""
    return list(b.js("return Array.from(document.querySelectorAll('#logs li'), li => li.textContent.trim())"))


def section(b: Browser, title: str) -> str:
    """The text of the ``<pre>`` under the job page's heading ``title`` (Request, Value, Error...)."""
    return str(b.driver.find_element(By.XPATH, f"//h2[.='{title}']/following-sibling::pre[1]").text)


def quiet(b: Browser, *expected: str) -> None:
    """The console had no error but those containing one of ``expected``."""
    errors = [e for e in b.console_errors() if not any(x in e for x in expected)]
    assert not errors, f"the browser's console had errors: {errors}"


# -- the tests ----------------------------------------------------------------------------------------
def test_a_running_job_is_followed_live_from_the_overview_and_cancelled_from_its_page(bed: Bed) -> None:
    bed.web()
    worker = bed.worker("--queue", "slow")
    job = bed.store.create({"steps": 300, "pause": 0.3}, queue="slow")
    bed.wait_state(job.id, "active")

    b = bed.open_browser()
    b.open("/", "overview")
    assert queue_view(b, "slow")["active"] == "1"
    # a worker publishes what it runs about once a second: the overview's refresh (every 3 s) catches up
    b.wait(lambda d: job.id[:12] in d.find_element(
        By.XPATH, f"//table[contains(@class, 'workers')]/tbody/tr[td[3]='{worker.pid}']/td[5]").text,
        "the workers table to show the worker running the job")

    b.click(queue_xpath("slow", "/td[1]/a"))
    b.wait(lambda d: b.path.startswith("/jobs?"), "the jobs table")
    b.shot("jobs of the queue")
    assert "queue=slow" in b.path
    row = b.driver.find_element(By.XPATH, f"//table[contains(@class, 'jobs')]/tbody/tr[td[1]/a='{job.id}']")
    assert row.find_element(By.CSS_SELECTOR, ".badge").text == "active"

    row.find_element(By.LINK_TEXT, job.id).click()
    b.wait(lambda d: b.path == f"/jobs/{job.id}", "the job's page")
    b.shot("running job")
    assert b.text("#state") == "active"
    b.js("window.__same_page = true")  # gone if the page is loaded again
    seen = b.text("#progress-text")
    lines = len(log_lines(b))
    b.wait(lambda d: b.text("#progress-text") not in ("", seen) and len(log_lines(b)) > lines,
           "the progress and the log to move on the page")
    moved = b.text("#progress-text")
    b.wait(lambda d: b.text("#progress-text") != moved, "the progress to move again")
    bar = b.js("var p = document.getElementById('progress'); return [p.value, p.max];")
    assert bar[1] == 300 and 0 < bar[0] <= 300, f"the progress bar is {bar}"
    assert re.fullmatch(r"\d+ / 300 \u00b7 step \d+ of 300", b.text("#progress-text")), b.text("#progress-text")
    assert log_lines(b)[-1].endswith(" done"), log_lines(b)[-1]
    assert b.js("return window.__same_page") is True, "the page was loaded again, not updated in place"
    b.shot("progress moved")

    b.driver.find_element(By.ID, "cancel").click()
    alert = b.wait(EC.alert_is_present(), "the confirm dialog", loaded=False)
    assert alert.text == f"Cancel job {job.id}?"
    alert.accept()
    b.wait(lambda d: b.text("#state") == "cancelled", "the page to show the job cancelled")
    # app.js loads the page again once the job is final: its actions and its "Why" are the final job's
    b.wait(lambda d: d.find_elements(By.ID, "retry"), "the final job's page")
    b.shot("cancelled")
    assert b.driver.find_element(By.ID, "state").get_attribute("class") == "badge big cancelled"
    assert not b.driver.find_elements(By.ID, "cancel")
    assert section(b, "Why").startswith("cancelled"), section(b, "Why")
    assert bed.store.get(job.id).state is JobState.CANCELLED
    assert job_json(bed.dir, job.id)["state"] == "cancelled"
    quiet(b)


def test_a_failed_job_retried_from_its_page_is_run_again_by_the_worker(bed: Bed) -> None:
    bed.web()
    bed.worker("--queue", "flaky")
    go = bed.root / "go"  # the second run waits for it
    job = bed.store.create({"marker": str(bed.root / "ran-once"), "go": str(go)}, queue="flaky", max_attempts=1)
    bed.wait_state(job.id, "failed")

    b = bed.open_browser()
    b.open(f"/jobs/{job.id}", "failed job")
    assert b.text("#state") == "failed"
    assert "the first run fails on purpose" in section(b, "Error")
    assert not b.driver.find_elements(By.ID, "cancel")

    b.driver.find_element(By.ID, "retry").click()
    b.wait(lambda d: "done=retried" in b.path, "the page after the retry")
    assert flash(b) == "The job will run again."
    assert b.text("#state") in ("pending", "active"), "the retried job is not running again"
    b.wait(lambda d: b.text("#state") == "active" and any("second run" in line for line in log_lines(b)),
           "the page to show the worker running it again")
    b.shot("running again")
    assert bed.store.get(job.id).state is JobState.ACTIVE
    go.touch()
    b.wait(lambda d: d.find_elements(By.XPATH, "//h2[.='Value']"), "the worker to fulfil the retried job", timeout=20)
    b.shot("fulfilled")
    assert b.text("#state") == "fulfilled"
    assert '"second_run": true' in section(b, "Value")
    assert "failed after 1 attempt" in b.driver.find_element(By.XPATH, "//h2[.='Earlier lives']/following::ol[1]").text

    stored = bed.store.get(job.id)
    assert stored.state is JobState.FULFILLED and stored.result() == {"second_run": True}
    assert [h["state"] for h in stored.history] == ["failed"]
    quiet(b)


def test_a_queue_paused_from_the_overview_keeps_its_new_job_pending_until_resumed(bed: Bed) -> None:
    bed.web()
    worker = bed.worker("--queue", "fast")
    bed.wait_state(bed.store.create({"n": 1}, queue="fast").id, "fulfilled")

    b = bed.open_browser()
    b.open("/", "overview")
    assert queue_view(b, "fast")["button"] == "Pause"
    b.click(queue_xpath("fast", "//button[@data-action='pause']"))
    b.wait(lambda d: "done=" in b.path, "the overview after the pause")
    b.shot("paused")
    assert flash(b) == "Queue fast paused."
    assert queue_view(b, "fast")["button"] == "Resume" and queue_view(b, "fast")["paused"]
    assert bed.store.paused() == {"fast"}

    held = bed.store.create({"n": 2}, queue="fast")
    made = time.monotonic()

    def pending() -> bool:
        assert bed.store.get(held.id).state is JobState.PENDING, "the worker took a job of a paused queue"
        return True

    b.wait(lambda d: pending() and d.find_element(By.ID, "overview").get_attribute("data-updated")
           and queue_view(b, "fast")["pending"] == "1", "the overview's refresh to show the new job")
    b.shot("refreshed")
    shown = queue_view(b, "fast")
    assert shown["button"] == "Resume" and shown["paused"], f"the refreshed overview does not show it paused: {shown}"
    while pending() and time.monotonic() - made < 2.0:  # the worker runs all along, and leaves it
        time.sleep(0.1)
    assert worker.popen.poll() is None

    b.click(queue_xpath("fast", "//button[@data-action='resume']"))
    b.wait(lambda d: "resumed" in b.path, "the overview after the resume")
    assert flash(b) == "Queue fast resumed."
    assert queue_view(b, "fast")["button"] == "Pause" and not queue_view(b, "fast")["paused"]
    bed.wait_state(held.id, "fulfilled")
    assert bed.store.paused() == frozenset()
    b.shot("resumed")
    quiet(b)


def test_a_job_created_from_the_form_and_a_purge_confirmed_after_its_count_reach_the_store(bed: Bed) -> None:
    bed.web()
    b = bed.open_browser()
    b.open("/new", "form")
    form = b.driver.find_element(By.CSS_SELECTOR, "form[action='/new']")
    fields = {name: form.find_element(By.NAME, name) for name in
              ("queue", "request", "priority", "max_attempts", "timeout", "job_id")}
    fields["queue"].clear()
    fields["queue"].send_keys("made")
    fields["request"].clear()
    fields["request"].send_keys('{"hello": "wor')
    b.driver.find_element(By.ID, "create").click()
    b.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "p.flash.bad"), "the form to say what is wrong")
    b.shot("refused")
    assert flash(b).startswith("InvalidRequest: the request is not JSON")
    typed = b.driver.find_element(By.NAME, "request").get_attribute("value")
    assert typed == '{"hello": "wor', f"what was typed is lost: {typed!r}"
    assert b.driver.find_element(By.NAME, "queue").get_attribute("value") == "made"

    typed = {"request": '{"hello": "world", "n": [1, 2]}', "priority": "5", "max_attempts": "2", "timeout": "90s",
             "job_id": "made-in-the-browser"}
    for name, value in typed.items():
        field = b.driver.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    b.driver.find_element(By.ID, "create").click()
    b.wait(lambda d: b.path.startswith("/jobs/made-in-the-browser"), "the new job's page")
    b.shot("created")
    assert flash(b) == "Job created."
    assert b.text("#state") == "pending"
    made = bed.store.get("made-in-the-browser")
    assert (made.request, made.queue, made.priority, made.max_attempts, made.timeout, made.state) == (
        {"hello": "world", "n": [1, 2]}, "made", 5, 2, 90.0, JobState.PENDING)

    old = [bed.store.create({"old": i}, queue="old") for i in range(3)]
    bed.store.fulfill(old[0].id, "done")
    bed.store.fulfill(old[1].id, "done")
    bed.store.cancel(old[2].id)
    waiting = bed.store.create({"old": "still pending"}, queue="old")
    elsewhere = bed.store.create({"other": 1}, queue="other")
    bed.store.fulfill(elsewhere.id, "done")

    b.open("/purge", "purge form")
    checked = [box.get_attribute("value") for box in b.driver.find_elements(By.CSS_SELECTOR, "input[name=states]")
               if box.is_selected()]
    assert checked == ["fulfilled", "failed", "cancelled"]
    b.driver.find_element(By.NAME, "queue").send_keys("old")
    b.driver.find_element(By.ID, "count").click()
    b.wait(lambda d: d.find_elements(By.ID, "purge"), "the dry run's count")
    b.shot("purge count")
    assert b.text("p.confirm") == "3 jobs would be removed for good."
    assert b.text("#purge") == "Purge 3 jobs"
    assert b.driver.find_element(By.NAME, "queue").get_attribute("value") == "old"
    assert all(bed.store.get(j.id) for j in old), "the dry run removed jobs"

    b.driver.find_element(By.ID, "purge").click()
    b.wait(lambda d: b.path.startswith("/?done="), "the overview after the purge")
    b.shot("purged")
    assert flash(b) == "Purged 3 job(s)."
    for j in old:
        with pytest.raises(JobNotFound):
            bed.store.get(j.id)
    assert bed.store.get(waiting.id).state is JobState.PENDING
    assert bed.store.get(elsewhere.id).state is JobState.FULFILLED
    assert bed.store.get(made.id).state is JobState.PENDING
    quiet(b, "status of 422")  # the refused form's answer


def test_a_job_whose_text_holds_html_is_shown_as_text_and_never_runs(bed: Bed) -> None:
    bed.web()
    job = bed.store.create({"note": SCRIPT, "img": IMG}, queue="xss")
    lease = bed.store.pull_work(queues="xss")  # the test is its worker: active, with a log and progress
    assert lease is not None and lease.id == job.id
    try:
        lease.log(SCRIPT)
        lease.progress(1, 3, IMG)
        b = bed.open_browser()

        def harmless(where: str) -> None:
            assert b.js("return window.__xss") is None, f"the job's text ran as script on {where}"
            assert b.js("return document.querySelectorAll('main script, main img').length") == 0, \
                f"the job's text became elements on {where}"

        b.open("/jobs", "jobs table")
        cell = b.driver.find_element(By.XPATH, f"//tr[td[1]/a='{job.id}']/td[contains(@class, 'request')]")
        assert SCRIPT in cell.text and "<img src=x onerror=" in cell.text, cell.text
        harmless("the jobs table")

        b.driver.find_element(By.LINK_TEXT, job.id).click()
        b.wait(lambda d: b.path == f"/jobs/{job.id}", "the job's page")
        b.shot("job page")
        request = section(b, "Request")
        assert SCRIPT in request and "<img src=x onerror=" in request, request
        assert log_lines(b)[-1].endswith(SCRIPT)
        assert b.text("#progress-text") == f"1 / 3 \u00b7 {IMG}"
        harmless("the job's page")

        lease.log(IMG)  # now through the live updates (app.js), not the server's template
        lease.progress(2, 3, SCRIPT)
        b.wait(lambda d: log_lines(b)[-1].endswith(IMG) and b.text("#progress-text") == f"2 / 3 \u00b7 {SCRIPT}",
               "the live update of the log and the progress")
        b.shot("live update")
        harmless("the job's page, updated live")

        lease.fail(IMG, retry=False)  # the page loads again to show the final job and its error
        b.wait(lambda d: d.find_elements(By.XPATH, "//h2[.='Error']"), "the page of the failed job")
        assert b.text("#state") == "failed" and section(b, "Error") == IMG
        harmless("the failed job's page")
    finally:
        if not lease.compromised and bed.store.get(job.id).state is JobState.ACTIVE:
            lease.release()

    b.open("/jobs?q=" + quote(SCRIPT), "search")
    assert f"\u201c{SCRIPT}\u201d" in b.text("p.meta")
    assert b.driver.find_element(By.NAME, "q").get_attribute("value") == SCRIPT
    assert b.driver.find_elements(By.LINK_TEXT, job.id), "the search does not find the job"
    harmless("the search")
    b.open("/?done=" + quote(IMG), "flash")  # free text in the link: no banner at all (codes only)
    assert not b.driver.find_elements(By.CSS_SELECTOR, "p.flash") and IMG not in b.driver.page_source
    harmless("the overview's message")
    b.open("/jobs?state=" + quote(SCRIPT), "error page")
    assert SCRIPT in b.text("p.flash.bad")
    harmless("an error page")
    quiet(b, "status of 422")  # the error page's answer


def test_a_narrow_window_shows_every_page_without_sideways_scrolling_in_light_and_dark(bed: Bed) -> None:
    bed.web()
    bed.worker("--queue", "slow", "--queue", "broken", "--concurrency", "2")
    long_word = "x" * 300
    running = bed.store.create({"steps": 300, "pause": 0.2, "path": "/a/" + "segment-" * 60, "blob": long_word},
                               queue="slow")
    failed = bed.store.create({"error": "E" * 600}, queue="broken", max_attempts=1)
    bed.store.create({"later": long_word}, queue="a-rather-long-queue-name-for-a-narrow-window", delay=3600)
    bed.wait_state(running.id, "active")
    bed.wait_state(failed.id, "failed")

    b = bed.open_browser(420, 900)
    every = ("/", "/jobs", f"/jobs/{running.id}", f"/jobs/{failed.id}", "/new", "/purge", "/api/docs")
    for theme, background, paths in (("light", "rgb(246, 247, 249)", every), ("dark", "rgb(18, 21, 27)", every[:4])):
        for path in paths:
            b.open(path, f"{theme} {path}")
            if theme == "dark" and path == "/":
                b.driver.find_element(By.ID, "theme").click()
                b.shot("dark overview")
            assert b.js("return document.documentElement.getAttribute('data-theme')") == (
                "dark" if theme == "dark" else None), f"{path} forgot the theme"
            shown = b.js("return getComputedStyle(document.body).backgroundColor")
            assert shown == background, f"{path} has the background {shown} in the {theme} theme"
            width, window = b.overflow()
            assert window == 420 and width <= window + 1, f"{path} is {width} px wide in a {window} px window ({theme})"
    quiet(b)


def test_a_server_with_a_token_sends_the_browser_to_sign_in_and_refuses_a_wrong_token(bed: Bed) -> None:
    token = "browser-test-token-1234"
    url = bed.web("--token", token)
    assert url.endswith(f"/?token={token}")
    bed.store.create({"n": 1}, queue="signed")

    b = bed.open_browser()
    b.open("/", "sent to sign in")
    assert b.path == "/login" and b.text("h1") == "Sign in"

    def sign_in(given: str) -> None:
        box = b.driver.find_element(By.NAME, "token")
        box.clear()
        box.send_keys(given)
        box.submit()

    sign_in("not-the-token")
    b.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "p.flash.bad"), "the refusal")
    b.shot("wrong token")
    assert flash(b) == "that is not this server's token"
    b.open("/jobs", "still outside")
    assert b.path == "/login"

    sign_in(token)
    b.wait(lambda d: b.path == "/" and d.find_elements(By.ID, "overview"), "the overview")
    b.shot("signed in")
    assert queue_view(b, "signed")["pending"] == "1"
    b.wait(lambda d: d.find_element(By.ID, "overview").get_attribute("data-updated"), "the overview's refresh")
    assert queue_view(b, "signed")["pending"] == "1", "the refresh lost the session"
    b.click(queue_xpath("signed", "//button[@data-action='pause']"))  # a form: the session and its CSRF token
    b.wait(lambda d: "done=" in b.path, "the overview after the pause")
    assert flash(b) == "Queue signed paused." and bed.store.paused() == {"signed"}

    b.driver.delete_all_cookies()  # a new browser, given the URL the server printed
    b.driver.get(url)
    b.wait(lambda d: d.find_elements(By.ID, "overview"), "the overview, from the printed URL")
    b.shot("printed URL")
    assert "token" not in b.driver.current_url, "the token stays in the address bar"
    quiet(b, "status of 403")  # the refused sign-in's answer
