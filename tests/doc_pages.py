"""Run a documentation page as a reader would: its files written, its shell blocks run in order.

    python tests/doc_pages.py docs/getting-started.md --wheel dist/fsjobstore-X.whl

A page is a series of fenced blocks. A ``{code-block}`` with a ``:caption:`` is a file to save
(``tasks.py``; ``tasks.py (append)`` appends to it); a ``bash`` block is typed into one shell
session, so ``cd`` and an activated virtualenv carry over. A command whose line ends in
``# serves until Ctrl-C`` is started in the background, its page and style fetched once it
serves (from an installed wheel: the templates and static files the package ships), and
stopped. With ``--wheel``, the page's ``pip install ".[extra]"`` installs that wheel instead
(the page is run where its reader would be, not in the repository); without it, install lines
are left out and the current environment's fsjobstore is used (the test suite's way).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass

_FENCE = re.compile(r"^```(\{code-block\}\s*)?(\w+)?\s*$")
SERVES = "# serves until Ctrl-C"


@dataclass(frozen=True)
class Block:
    language: str
    caption: str | None
    text: str


def blocks(page: str) -> list[Block]:
    """The fenced blocks of a MyST page, in order."""
    out: list[Block] = []
    lines = page.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not m.group(2):
            i += 1
            continue
        language, caption, body = m.group(2), None, []
        i += 1
        while i < len(lines) and lines[i].startswith(":"):  # directive options
            key, _, value = lines[i][1:].partition(":")
            if key == "caption":
                caption = value.strip()
            i += 1
        while i < len(lines) and lines[i] != "```":
            body.append(lines[i])
            i += 1
        out.append(Block(language, caption, "\n".join(body).strip("\n") + "\n"))
        i += 1
    return out


def script(page: str, wheel: str | None) -> tuple[str, dict[str, str]]:
    """The page as one bash script, and the files it saves on the way (by name, in order)."""
    parts = ["set -euo pipefail", "export COLUMNS=100"]
    files: dict[str, str] = {}
    for n, block in enumerate(blocks(page)):
        if block.caption is not None:
            name, _, how = block.caption.partition(" ")
            tag = f"__file_{n}"
            files[tag] = block.text
            op = ">>" if how == "(append)" else ">"
            parts.append(f'cat "$DOC_FILES/{tag}" {op} {shlex.quote(name)}')
        elif block.language == "bash":
            for line in block.text.splitlines():
                parts.append(_shell_line(line, wheel))
    return "\n".join(p for p in parts if p) + "\n", files


def _shell_line(line: str, wheel: str | None) -> str:
    if line.rstrip().endswith(SERVES):
        command = line.rstrip()[: -len(SERVES)].strip()
        return (f"{command} --port 0 > serve.out 2>&1 & served=$!\n"
                "for _ in $(seq 100); do grep -q 'serving' serve.out && break; sleep 0.1; done\n"
                "url=$(sed -n 's/.* at \\(http[^ ]*\\).*/\\1/p' serve.out)\n"
                'python -c "import sys, urllib.request as u; '
                "page = u.urlopen(sys.argv[1], timeout=10).read().decode(); "
                "css = u.urlopen(sys.argv[1] + 'static/app.css', timeout=10).read().decode(); "
                "sys.exit(0 if '<h2>Queues</h2>' in page and ':root' in css "
                "else 'the dashboard did not serve its page and style')\" \"$url\"\n"
                'kill "$served"; wait "$served" || true')
    if "python3 -m venv" in line or "pip install" in line:
        if wheel is None:
            return ""  # the suite's own environment has fsjobstore and its extras
        return re.sub(r'"\.(\[[\w,]+\])?"', lambda m: shlex.quote(wheel + (m.group(1) or "")), line)
    return line


def run(page_path: str, wheel: str | None, workdir: str) -> subprocess.CompletedProcess[str]:
    with open(page_path, encoding="utf-8") as fh:
        text, files = script(fh.read(), wheel)
    store_files = os.path.join(workdir, ".doc-files")
    os.makedirs(store_files, exist_ok=True)
    for tag, body in files.items():
        with open(os.path.join(store_files, tag), "w", encoding="utf-8") as fh:
            fh.write(body)
    # The page's own `cd` moves into its tutorial directory: point that under workdir.
    text = text.replace("/tmp/tutorial", os.path.join(workdir, "tutorial"))
    env = dict(os.environ, DOC_FILES=store_files)
    env.pop("FSJOBSTORE_DIR", None)
    if wheel is not None:
        env.pop("VIRTUAL_ENV", None)
    else:  # the suite's interpreter and its scripts (fsjobstore) come first
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.run(["bash", "-c", text], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=600)


RUNS_UNTIL_STOPPED = ".run()"  # a worker's run(): until SIGTERM, as a service would


def run_python(code: str, workdir: str, *, stop_after: float = 3.0) -> tuple[int, str]:
    """Run one Python example as a reader would save and run it, in ``workdir``: (exit code,
    output). One that runs a worker until it is stopped (``worker.run()``) gets SIGTERM after
    ``stop_after`` seconds and must then stop cleanly, as under systemd."""
    path = os.path.join(workdir, "example.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(code)
    env = dict(os.environ)
    env.pop("FSJOBSTORE_DIR", None)
    proc = subprocess.Popen([sys.executable, path], cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=stop_after if RUNS_UNTIL_STOPPED in code else 120)
    except subprocess.TimeoutExpired:
        if RUNS_UNTIL_STOPPED not in code:
            proc.kill()
            return -9, proc.communicate()[0] + "\n(killed: it ran for 120 s)"
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return -9, proc.communicate()[0] + "\n(killed: it did not stop within 60 s of SIGTERM)"
    return proc.returncode, out


def build_site(out: str) -> subprocess.CompletedProcess[str]:
    """Build docs/ into ``out``/html as the README says: warnings are errors, references checked."""
    docs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
                           "-d", os.path.join(out, ".doctrees"), docs, os.path.join(out, "html")],
                          capture_output=True, text=True, timeout=300)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("page")
    ap.add_argument("--wheel", help="install this wheel where the page says pip install")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fsjobstore-doc-") as work:
        done = run(args.page, os.path.abspath(args.wheel) if args.wheel else None, work)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    if done.returncode:
        print(f"{args.page}: its commands failed (exit {done.returncode})", file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
