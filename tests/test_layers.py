"""The house rules that keep the layers apart, checked on the source itself.

The runtime (``fsjobstore.worker``, ``fsjobstore._runtime``, ``fsjobstore.schedule``), asyncio
(``fsjobstore.aio``) and the command line (``fsjobstore._cli``) are built on the public API only, as a
user's code would be; the public API is exactly ``fsjobstore.__all__``; no module grows past what one
sitting can read.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import fsjobstore

PACKAGE = Path(fsjobstore.__file__).parent
# The layers above the store: theirs to import from each other.
UPPER = ("worker", "aio", "schedule", "web", "_runtime", "_cli")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, names imported from it) for every import in the file."""
    tree = ast.parse(path.read_text())
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.append((module, [alias.name for alias in node.names]))
    return out


def upper_layer_files() -> list[Path]:
    files = [PACKAGE / "worker.py", PACKAGE / "aio.py", PACKAGE / "schedule.py"]
    for sub in ("_runtime", "_cli", "web"):
        files += sorted((PACKAGE / sub).glob("*.py"))
    return files


def test_the_runtime_and_the_cli_use_only_the_public_api() -> None:
    assert len(upper_layer_files()) >= 8
    offences = []
    for path in upper_layer_files():
        for module, names in _imports(path):
            if not module.startswith("fsjobstore"):
                continue
            parts = module.split(".")
            if len(parts) > 1 and parts[1] not in UPPER:
                offences.append(f"{path.name} imports {module}")
            if module == "fsjobstore":
                offences += [f"{path.name} imports fsjobstore.{n}" for n in names
                             if n.startswith("_") and n != "__version__"]
    assert offences == []


def test_the_layer_check_notices_a_reach_into_a_private_module(tmp_path: Path, monkeypatch: object) -> None:
    # The check above must be able to fail: run its logic on a file that does what it forbids.
    bad = PACKAGE / "_runtime" / "_reach_probe_for_test.py"
    bad.write_text("from .._os._syscalls import rename\nfrom .. import _tree\n")
    try:
        found = [m for m, names in _imports(bad) if m.startswith("fsjobstore.") and m.split(".")[1] not in UPPER]
        found += [n for m, names in _imports(bad) if m == "fsjobstore" for n in names if n.startswith("_")]
        assert found == ["fsjobstore._os._syscalls", "_tree"]
    finally:
        bad.unlink()


def test_the_public_api_is_exactly_all() -> None:
    assert sorted(fsjobstore.__all__) == sorted(set(fsjobstore.__all__)), "a name is listed twice"
    for name in fsjobstore.__all__:
        assert hasattr(fsjobstore, name), name
    exported = {
        name for name, obj in vars(fsjobstore).items()
        if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", "").startswith("fsjobstore")
    }
    missing = sorted(exported - set(fsjobstore.__all__))
    assert missing == [], f"public but not in __all__: {missing}"
    assert set(fsjobstore.__all__) == {
        "FORMAT_VERSION", "Group", "MAX_NESTING", "MAX_TARGETS", "MAX_PRIORITY", "MIN_PRIORITY", "AttemptError",
        "CorruptJob", "Deliverer",
        "InvalidJobId", "InvalidName",
        "InvalidQueueName", "InvalidRequest",
        "InvalidState", "Job", "JobCancelled", "JobContext", "JobEvent", "JobExists", "JobFailed", "JobNotFound",
        "JobState",
        "JobStore", "JobStoreError", "LeaseLost", "Limit", "LogLine", "NotificationLease", "Progress", "QueueCounters",
        "RecoveryReport", "StoreCounters",
        "RunSummary", "Schedule", "ScheduleInfo", "tick_of",
        "StorageError", "StorageFull", "StoreClosed", "StoreFormatError", "StoreNotFound", "StoreStatistics",
        "UntrustedStore", "ValueTooLarge", "VerifyCheck", "VerifyReport", "WaitTimeout", "Wakeups", "WorkLease",
        "Worker",
        "WorkerFailing", "WorkerInfo", "__version__", "check_interest", "check_queue_name", "check_queues",
        "Subscription", "default_backoff", "parse_duration", "verify",
        "verify_across_hosts",
    }, "the public API changed: update this list (and the README's API table) on purpose"


def test_every_error_derives_from_the_root_and_is_documented() -> None:
    errors = importlib.import_module("fsjobstore._errors")
    doc = errors.__doc__ or ""
    for name in fsjobstore.__all__:
        obj = getattr(fsjobstore, name)
        if inspect.isclass(obj) and issubclass(obj, Exception):
            assert issubclass(obj, fsjobstore.JobStoreError), name
            assert name in doc, f"{name} is missing from the exception tree in _errors' docstring"


def test_no_module_is_longer_than_one_sitting() -> None:
    long = {p.relative_to(PACKAGE).as_posix(): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 520}
    assert long == {}
