"""The documentation site (docs/) builds strict and offline, documents the whole public API and
the whole command line, and its getting-started page runs as written."""

from __future__ import annotations

import html
import re
import zlib
from pathlib import Path

import pytest
from doc_pages import blocks, build_site, run, run_python, script

import fsjobstore

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built as the README says, warnings as errors (-W) and every reference checked (-n)."""
    out = tmp_path_factory.mktemp("site")
    done = build_site(str(out))
    assert done.returncode == 0, f"the docs build failed:\n{done.stdout}\n{done.stderr}"
    return out / "html"


def _text(page: Path) -> str:
    """A built page's text, as a reader sees it (tags dropped, entities read)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", page.read_text())).split())


def _inventory(site: Path) -> set[str]:
    """Every object the site documents, by its full name (Sphinx's objects.inv)."""
    raw = (site / "objects.inv").read_bytes()
    body = zlib.decompress(raw.split(b"\n", 4)[4]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines()}


def test_every_public_name_has_an_entry_in_the_api_reference(site: Path) -> None:
    documented = _inventory(site)
    missing = [name for name in fsjobstore.__all__ if f"fsjobstore.{name}" not in documented]
    assert missing == [], f"in fsjobstore.__all__ but not in docs/reference: {missing}"


def test_the_api_reference_check_notices_a_name_left_out(site: Path) -> None:
    assert "fsjobstore.JobStore.create" in _inventory(site)
    assert "fsjobstore.NoSuchThing" not in _inventory(site)


def test_every_command_has_its_usage_and_example_in_the_cli_reference(site: Path) -> None:
    from fsjobstore._cli import build_parser

    page = _text(site / "reference" / "cli.html")
    commands = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    for name in commands:
        assert f"fsjobstore {name} [options]" in page or f"usage: fsjobstore {name}" in page, name
    assert page.count("example:") >= len(set(map(id, commands.values())))


def test_the_http_reference_lists_every_route_of_the_api(site: Path) -> None:
    from fsjobstore import JobStore
    from fsjobstore.web import create_app

    page = _text(site / "reference" / "http.html")
    with JobStore(str(site.parent / "api-store")) as store:
        paths = create_app(store).openapi()["paths"]
    for path, methods in paths.items():
        for method in methods:
            assert f"{method.upper()} {path}" in page, (method, path)


def test_no_built_page_loads_anything_from_another_site(site: Path) -> None:
    # Scripts, styles, fonts and images: a page read offline (or behind a firewall) is whole.
    loads = re.compile(r"<(?:script|img|link|iframe|source)\b[^>]*?\b(?:src|href)=\"(https?:)?//", re.I)
    offenders = [str(p.relative_to(site)) for p in site.rglob("*.html") if loads.search(p.read_text())]
    assert offenders == []
    for css in site.rglob("*.css"):
        assert not re.search(r"@import\s+url\(\s*['\"]?https?:|url\(\s*['\"]?https?://", css.read_text()), css


def test_the_readme_fits_a_screen_or_two_and_points_into_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", readme):
        assert (ROOT / link).is_file(), link


def test_the_page_runner_reads_files_and_commands_in_order() -> None:
    page = ("Save `a.py`:\n\n```{code-block} python\n:caption: a.py\n\nprint(1)\n```\n\n"
            "```bash\npip install \".[web]\"\npython a.py\n```\n\n"
            "```{code-block} python\n:caption: a.py (append)\n\nprint(2)\n```\n")
    assert [b.caption for b in blocks(page)] == ["a.py", None, "a.py (append)"]
    text, files = script(page, "/w/fsjobstore-1.whl")
    assert "pip install '/w/fsjobstore-1.whl[web]'" in text
    assert text.index("> a.py") < text.index("python a.py") < text.index(">> a.py")
    assert list(files.values()) == ["print(1)\n", "print(2)\n"]
    assert "pip install" not in script(page, None)[0]  # the suite's own environment instead


def test_the_getting_started_page_runs_as_written(tmp_path: Path) -> None:
    done = run(str(DOCS / "getting-started.md"), None, str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fulfilled worked on attempt 2 after 2 attempts" in done.stdout
    assert "attempt 1 failed: ConnectionError: the server hung up" in done.stdout
    assert re.search(r"\{'n': 5\} -> \{'square': 25\}", done.stdout)


def _examples() -> list[object]:
    """Every Python block of the README and the docs' pages (files a page saves are run by the
    page's own test), one test each, named by page and number."""
    pages = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0][0] != "_")]
    out = []
    for page in pages:
        name = str(page.relative_to(ROOT))
        python = [b for b in blocks(page.read_text()) if b.language == "python" and b.caption is None]
        out += [pytest.param(name, n, b.text, id=f"{name}:{n + 1}") for n, b in enumerate(python)]
    return out


@pytest.mark.parametrize(("page", "n", "code"), _examples())
def test_every_python_example_of_the_docs_runs_as_written(tmp_path: Path, page: str, n: int, code: str) -> None:
    status, out = run_python(code, str(tmp_path))
    assert status == 0, f"{page}, Python example {n + 1}:\n{code}\n--- its output:\n{out}"


def test_an_example_that_fails_fails_its_test(tmp_path: Path) -> None:
    assert run_python("import fsjobstore\nraise SystemExit(3)\n", str(tmp_path))[0] == 3
    status, out = run_python("from fsjobstore import JobStore\nJobStore('./jobs').get('nope')\n", str(tmp_path))
    assert status == 1 and "JobNotFound" in out


def test_every_environment_variable_the_code_reads_is_on_the_configuration_page() -> None:
    page = (DOCS / "reference" / "configuration.md").read_text()
    source = " ".join(p.read_text() for p in (ROOT / "fsjobstore").rglob("*.py"))
    read = set(re.findall(r"\bFSJOBSTORE_[A-Z_]+\b", source))
    assert read >= {"FSJOBSTORE_DIR", "FSJOBSTORE_WEB_TOKEN"}
    assert sorted(name for name in read if f"`{name}`" not in page) == []
