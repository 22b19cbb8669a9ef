"""Other projects' own test suites, fetched from PyPI at test time (never copied in here): the
source distribution of the version installed, so the tests match the code they test."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

from filelock import FileLock

CACHE = Path(os.environ.get("FSJOBSTORE_TEST_CACHE", Path.home() / ".cache" / "fsjobstore-tests"))


def source_tree(project: str) -> Path:
    """The unpacked sdist of the installed ``project``, downloaded once per version."""
    version = importlib.metadata.version(project)
    dest = CACHE / f"{project}-{version}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(CACHE / f".{project}.lock")):
        if (dest / "PKG-INFO").is_file():
            return dest
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            "-d", tmp, f"{project}=={version}"], check=True)
            (archive,) = Path(tmp).glob(f"{project}-{version}.tar.gz")
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            shutil.move(str(Path(tmp) / f"{project}-{version}"), dest)
    return dest


def load(path: Path, name: str) -> ModuleType:
    """Import one file of an upstream tree as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
