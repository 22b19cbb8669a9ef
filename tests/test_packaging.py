"""What a user installs: the wheel built from this source tree holds the whole package.

CI and the tests run an editable install, which imports straight from the source tree and so
never notices a package the build leaves out (issue 19: the wheel had no ``fsjobstore/_runtime``
and ``import fsjobstore`` failed). These tests build a real wheel and look inside it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

import fsjobstore

pytestmark = pytest.mark.slow

PACKAGE = Path(fsjobstore.__file__).parent
REPO = PACKAGE.parent
# What the build reads. Copied into a fresh directory, because setuptools reuses ./build/lib:
# a package left there by an earlier build would land in the wheel even if the build missed it.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", PACKAGE.name)


def _setuptools_is_new_enough() -> bool:
    """Whether the installed setuptools meets pyproject's build requirement (>=77), so the
    build can run without fetching one (build isolation goes to the package index)."""
    try:
        major = int(version("setuptools").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return False
    return major >= 77


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (REPO / "pyproject.toml").is_file():
        pytest.skip(f"fsjobstore is not imported from a source tree ({PACKAGE})")
    work = tmp_path_factory.mktemp("packaging")
    source = work / "src"
    source.mkdir()
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(work / "dist"), str(source)]
    if _setuptools_is_new_enough():
        command.insert(4, "--no-build-isolation")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"building the wheel failed:\n{done.stdout}\n{done.stderr}"
    (built,) = (work / "dist").glob("fsjobstore-*.whl")
    return built


def _source_files(suffix: str) -> set[str]:
    """The package's files with that suffix, as paths inside a wheel (``fsjobstore/...``)."""
    return {
        path.relative_to(REPO).as_posix()
        for path in PACKAGE.rglob(f"*{suffix}")
        if "__pycache__" not in path.parts
    }


def test_the_wheel_holds_every_package_directory_of_the_source_tree(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {name for name in _source_files(".py") if name.endswith("/__init__.py")}
    assert packages, "no package found in the source tree"
    missing = sorted(p.rsplit("/", 1)[0] for p in packages if p not in names)
    assert not missing, f"package directories missing from {wheel.name}: {missing}"


def test_the_wheel_holds_every_module_of_the_source_tree(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_source_files(".py") - names)
    assert not missing, f"modules missing from {wheel.name}: {missing}"


def test_the_wheel_ships_py_typed_so_type_checkers_read_its_annotations(wheel: Path) -> None:
    assert "fsjobstore/py.typed" in zipfile.ZipFile(wheel).namelist()


def test_the_wheel_alone_imports_the_store_the_runtime_and_the_command_line(wheel: Path, tmp_path: Path) -> None:
    # A wheel is a zip Python can import from. -S leaves out site, so the editable install's
    # finder (a .pth file) cannot answer for a module the wheel lacks; the dependencies are
    # found through their directories on PYTHONPATH, after the wheel.
    code = (
        "import sys, fsjobstore, fsjobstore.worker, fsjobstore._runtime, fsjobstore._cli as cli\n"
        "for module in (fsjobstore, fsjobstore._runtime, cli):\n"
        "    assert module.__file__.startswith(sys.argv[1]), module.__file__\n"
        "assert callable(cli.main)\n"
        "print(fsjobstore.__version__)\n"
    )
    libs = dict.fromkeys([str(wheel), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(libs)}
    command = [sys.executable, "-S", "-c", code, str(wheel)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == fsjobstore.__version__


def test_the_wheel_ships_the_dashboards_pages_style_and_script(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    web = PACKAGE / "web"
    shipped = {p.relative_to(REPO).as_posix() for d in ("templates", "static") for p in (web / d).iterdir()}
    assert shipped, "no template or static file found in the source tree"
    missing = sorted(shipped - names)
    assert not missing, f"the dashboard's files missing from {wheel.name}: {missing}"
