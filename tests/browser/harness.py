"""What the dashboard's browser tests (and ``screenshots.py``) are made of: a store in a directory,
a real ``fsjobstore web`` and ``fsjobstore worker`` as subprocesses, a handler module of our own
written next to the store, and headless Chromium driven through Selenium.

Nothing is fetched: Selenium is given Debian's ``/usr/bin/chromium`` and ``/usr/bin/chromedriver``
(``tests/browser/install.sh``), never Selenium Manager. ``FSJOBSTORE_CHROMIUM`` and
``FSJOBSTORE_CHROMEDRIVER`` name other paths.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CHROMIUM = os.environ.get("FSJOBSTORE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FSJOBSTORE_CHROMEDRIVER", "/usr/bin/chromedriver")
SHOTS_ENV = "FSJOBSTORE_SCREENSHOTS"
_URL_LINE = re.compile(r"^fsjobstore web: serving .* at (http://\S+)")


def missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    for module, extra in (("selenium", "selenium"), ("fastapi", "the web extra"), ("uvicorn", "the web extra"),
                          ("jinja2", "the web extra")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed ({extra}): pip install -e '.[test]'"
    for what, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)):
        if not os.access(path, os.X_OK):
            return f"{what} is not at {path}: run tests/browser/install.sh as root (apt: chromium chromium-driver)"
    return None


# -- the handlers the worker runs: a module written next to the store ---------------------------------
HANDLERS = textwrap.dedent('''
    """Handlers for the dashboard's browser tests, one per queue (``--handlers dash_handlers:handlers``)."""
    import time
    from pathlib import Path


    def _sleep(job, seconds):
        """Sleep in small steps, giving a cancel the chance to end the job between them."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            job.raise_if_cancelled()
            time.sleep(0.05)


    def slow(job):
        """request {"steps": N, "pause": S}: N steps of S seconds, each one reported (progress, log line)."""
        steps = int(job.request.get("steps", 100))
        pause = float(job.request.get("pause", 0.3))
        job.log(f"attempt {job.attempt}: {steps} steps to go")
        for i in range(1, steps + 1):
            _sleep(job, pause)
            job.progress(i, steps, f"step {i} of {steps}")
            job.log(f"step {i} done")
        return {"steps": steps}


    def flaky(job):
        """Fails the first time it sees a job (it leaves request["marker"] behind); the next time it
        waits for the file request["go"] (at most 30 s), then succeeds."""
        marker = Path(job.request["marker"])
        if not marker.exists():
            marker.write_text(job.id)
            job.log("first run: failing on purpose")
            raise RuntimeError("the first run fails on purpose")
        job.log("second run: the marker is there")
        go = Path(job.request["go"])
        end = time.monotonic() + 30
        while not go.exists() and time.monotonic() < end:
            _sleep(job, 0.05)
        job.progress(1, 1, "second run")
        return {"second_run": True}


    def fast(job):
        return {"echo": job.request}


    def broken(job):
        raise ValueError(job.request.get("error", "broken on purpose"))


    handlers = {"slow": slow, "flaky": flaky, "fast": fast, "broken": broken}
''')
HANDLER_MODULE = "dash_handlers"


class Proc:
    """A subprocess in a session of its own, its output in files next to the store."""

    def __init__(self, name: str, argv: list[str], *, cwd: Path, logs: Path) -> None:
        self.name = name
        self.out = logs / f"{name}.out"
        self.err = logs / f"{name}.err"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("FSJOBSTORE_WEB_TOKEN", None)
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.popen = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          start_new_session=True, env=env)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self, tail: int = 40) -> str:
        lines: list[str] = []
        for path in (self.out, self.err):
            with contextlib.suppress(OSError):
                lines += path.read_text(errors="replace").splitlines()[-tail:]
        return "\n".join(lines)

    def stop(self, wait: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL (to its whole process group) if it has not ended within ``wait``;
        returns its exit status (negative: the signal that ended it)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(wait)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # children it left behind, if any
            os.killpg(self.popen.pid, signal.SIGKILL)
        return self.popen.returncode


def fsjobstore(*args: str) -> list[str]:
    return [sys.executable, "-m", "fsjobstore", *args]


def start_web(store: Path, *args: str, logs: Path, name: str = "web", timeout: float = 20.0) -> tuple[Proc, str]:
    """``fsjobstore web STORE --port 0 ARGS``; returns it and the URL it printed on its first line."""
    proc = Proc(name, fsjobstore("web", str(store.resolve()), "--port", "0", *args), cwd=logs, logs=logs)
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            first = proc.out.read_text().split("\n", 1)
            if len(first) == 2:
                m = _URL_LINE.match(first[0])
                if not m:
                    proc.stop()
                    raise AssertionError(f"fsjobstore web printed {first[0]!r}, not its URL")
                return proc, m[1]
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            proc.stop()
            raise AssertionError(f"fsjobstore web did not start (exit {proc.popen.returncode}):\n{proc.output()}")
        time.sleep(0.05)


def start_worker(store: Path, *args: str, cwd: Path, logs: Path, name: str = "worker",
                 handlers: str = f"{HANDLER_MODULE}:handlers", timeout: float = 20.0) -> Proc:
    """``fsjobstore worker STORE --handlers HANDLERS ARGS`` run from ``cwd`` (where the handler
    module is); returns once the store lists it among its workers."""
    from fsjobstore import JobStore

    argv = fsjobstore("worker", str(store.resolve()), "--handlers", handlers, "--grace", "0.5", *args)
    proc = Proc(name, argv, cwd=cwd, logs=logs)
    deadline = time.monotonic() + timeout
    with JobStore(store, create=False) as s:
        while not any(w.pid == proc.pid for w in s.workers()):
            if proc.popen.poll() is not None or time.monotonic() > deadline:
                proc.stop()
                raise AssertionError(f"the worker did not start (exit {proc.popen.returncode}):\n{proc.output()}")
            time.sleep(0.05)
    return proc


def new_driver(width: int = 1280, height: int = 800) -> Any:
    """Headless Chromium through Debian's chromedriver; its page area is ``width`` x ``height``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--disable-extensions", "--no-first-run", "--no-default-browser-check", "--disable-sync",
                "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
                "--mute-audio", "--disable-features=Translate,OptimizationHints,MediaRouter",
                "--hide-scrollbars", "--force-color-profile=srgb", "--lang=en-US", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.page_load_strategy = "normal"
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    driver.set_script_timeout(10)
    resize(driver, width, height)
    return driver


def resize(driver: Any, width: int, height: int) -> None:
    """Make the page area (``window.innerWidth`` x ``innerHeight``) exactly this size."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


class Browser:
    """One Chromium for one test, on one server: visits pages by path and keeps a screenshot of each
    step as ``<prefix>-<NN>-<step>.png`` in ``shots``."""

    def __init__(self, driver: Any, base: str, shots: Path, prefix: str) -> None:
        self.driver = driver
        self.base = base.split("?", 1)[0].rstrip("/")
        self.shots = shots
        self.prefix = re.sub(r"[^\w.-]+", "_", prefix)[:150]
        self.steps = 0

    def url(self, path: str) -> str:
        return self.base + path

    def open(self, path: str, step: str) -> None:
        self.driver.get(self.url(path))
        self.shot(step)

    def shot(self, step: str) -> Path:
        self.shots.mkdir(parents=True, exist_ok=True)
        self.steps += 1
        label = re.sub(r"[^\w.-]+", "_", step).strip("_")
        path = self.shots / f"{self.prefix}-{self.steps:02d}-{label}.png"
        self.driver.save_screenshot(str(path))
        return path

    @property
    def path(self) -> str:
        """The current page's path and query."""
        parts = urlsplit(self.driver.current_url)
        return parts.path + (f"?{parts.query}" if parts.query else "")

    def wait(self, condition: Callable[[Any], Any], what: str, timeout: float = 15.0, loaded: bool = True) -> Any:
        """Poll ``condition(driver)`` every 0.1 s until it is truthy, on a page done loading (unless
        ``loaded`` is False: a dialog is open, say); fails saying ``what`` was awaited.

        A click that submits a form does not wait for the page it leads to, and the URL changes
        before that page has loaded: so a wait also waits for the load, or the next command would
        meet a navigation still under way. A page replaced under ``condition`` (app.js loads a job's
        page again when the job ends) is polled again: chromedriver reports that as a stale element,
        a missing one, or as a plain WebDriverException ("Node with given id does not belong to the
        document")."""
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.support.ui import WebDriverWait

        def met(driver: Any) -> Any:
            if loaded and driver.execute_script("return document.readyState") != "complete":
                return False
            return condition(driver)

        return WebDriverWait(self.driver, timeout, poll_frequency=0.1, ignored_exceptions=(WebDriverException,)
                             ).until(met, f"waited {timeout} s for {what}")

    def text(self, css: str) -> str:
        """The shown text of the first element ``css`` selects, read in one step (a page being
        replaced cannot change it halfway)."""
        from selenium.common.exceptions import NoSuchElementException

        got = self.js("var e = document.querySelector(arguments[0]); return e === null ? null : e.innerText;", css)
        if got is None:
            raise NoSuchElementException(f"nothing on {self.path} matches {css}")
        return str(got).strip()

    def click(self, xpath: str, tries: int = 5) -> None:
        """Click what ``xpath`` finds, finding it again if the page replaced it in between (the
        overview's middle is fetched again every 3 s)."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.by import By

        for attempt in range(tries):
            try:
                self.driver.find_element(By.XPATH, xpath).click()
                return
            except StaleElementReferenceException:
                if attempt == tries - 1:
                    raise

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def console_errors(self) -> list[str]:
        """The browser console's errors since the last call (script errors, failed loads, CSP)."""
        return [f"{e.get('source')}: {e.get('message')}" for e in self.driver.get_log("browser")
                if e.get("level") == "SEVERE"]

    def overflow(self) -> tuple[int, int]:
        """(page width, window width): the page overflows sideways when the first exceeds the second."""
        w = self.js("return [document.documentElement.scrollWidth, window.innerWidth]")
        return int(w[0]), int(w[1])


def job_json(store: Path, job_id: str) -> dict[str, Any]:
    """``fsjobstore get STORE ID --json``: what the command line says of a job."""
    done = subprocess.run(fsjobstore("get", str(store), job_id, "--json"), capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, f"fsjobstore get {job_id} failed: {done.stderr}"
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


class Bed:
    """One test's world under ``root``: the store (``root/store``), the handler module, the
    processes it started (web servers, workers), one browser, the stores it opened. ``close()``
    ends them all, in the order that lets each go quickly: the browser (its open event streams), the
    workers, the servers."""

    def __init__(self, root: Path, shots: Path, prefix: str) -> None:
        from fsjobstore import JobStore

        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.dir = root / "store"
        self.logs = root / "logs"
        self.logs.mkdir(exist_ok=True)
        (root / f"{HANDLER_MODULE}.py").write_text(HANDLERS)
        self.shots = shots
        self.prefix = prefix
        self.store = JobStore(self.dir)  # the test's own view: makes the store, creates and checks jobs
        self.procs: list[Proc] = []
        self.browser: Browser | None = None
        self.url = ""
        self._launch: concurrent.futures.Future[Any] | None = None

    def prelaunch(self) -> None:
        """Start Chromium now, in a thread, while the test starts its server and worker."""
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chromium")
        self._launch = pool.submit(new_driver)
        pool.shutdown(wait=False)

    def web(self, *args: str) -> str:
        """Start ``fsjobstore web`` on the store; returns the URL it printed."""
        proc, self.url = start_web(self.dir, *args, logs=self.logs, name=f"web{len(self.procs)}")
        self.procs.append(proc)
        return self.url

    def worker(self, *args: str, handlers: str = f"{HANDLER_MODULE}:handlers") -> Proc:
        """Start ``fsjobstore worker`` on the store with a handler module of ``root``; returns once
        the store lists it."""
        proc = start_worker(self.dir, *args, cwd=self.root, logs=self.logs, name=f"worker{len(self.procs)}",
                            handlers=handlers)
        self.procs.append(proc)
        return proc

    def open_browser(self, width: int = 1280, height: int = 800) -> Browser:
        assert self.url, "start the web server first"
        assert self.browser is None, "one browser per test"
        if self._launch is not None:
            driver, self._launch = self._launch.result(timeout=60), None
            resize(driver, width, height)
        else:
            driver = new_driver(width, height)
        self.browser = Browser(driver, self.url, self.shots, self.prefix)
        return self.browser

    def wait_state(self, job_id: str, *states: str, timeout: float = 15.0) -> Any:
        """Poll the store until the job is in one of ``states``; returns its snapshot."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.store.get(job_id)
            if job.state.value in states:
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {job.state.value} after {timeout} s, not {'/'.join(states)}"
                                     f"\n{self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        return "\n".join(f"--- {p.name} (pid {p.pid}, exit {p.popen.poll()}):\n{p.output()}" for p in self.procs)

    def close(self) -> None:
        try:
            drivers = [self.browser.driver] if self.browser is not None else []
            if self._launch is not None:  # launched, never used
                with contextlib.suppress(Exception):
                    drivers.append(self._launch.result(timeout=60))
            for driver in drivers:
                with contextlib.suppress(Exception):
                    driver.quit()
            for proc in sorted(self.procs, key=lambda p: not p.name.startswith("worker")):
                proc.stop()
        finally:
            self.store.close()
