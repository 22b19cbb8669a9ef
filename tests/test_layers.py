"""The house rules that keep the layers apart, checked on the source itself.

The store is built in layers, each a package importing only those beneath it (``LAYERS``, from the
bottom): the OS door, the format, the core of an open store, the transitions, the features that
relate jobs, the store users hold. The runtime (``fsjobstore.worker``, ``fsjobstore._runtime``,
``fsjobstore.schedule``), asyncio (``fsjobstore.aio``), the command line (``fsjobstore._cli``), the
web layer and the plug-ins for other projects (``fsjobstore.contrib``) are built on the public API
only, as a user's code would be; the public API is exactly ``fsjobstore.__all__``; no module
imports another that imports it back; no module of machinery grows past what one sitting can read.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import fsjobstore

PACKAGE = Path(fsjobstore.__file__).parent
# The layers above the store: theirs to import from each other.
UPPER = ("worker", "aio", "schedule", "web", "_runtime", "_cli", "contrib")
# The store's layers, from the bottom: each may import only itself and those before it.
LAYERS = ("_errors", "_os", "_format", "_core", "_transitions", "_relations", "_store")
# A facade may be long (its public methods, each short): the one stated exception to the size rule.
FACADES = ("_store/_jobstore.py",)


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, source: str | None = None) -> list[tuple[str, list[str]]]:
    """(absolute module, names imported from it) for every import in the file (or in ``source``,
    read as the file at ``path`` would be)."""
    tree = ast.parse(path.read_text() if source is None else source)
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
    for sub in ("_runtime", "_cli", "web", "contrib"):
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
    # Read as if it were in the package, never written there: the other tests list the package's
    # files from other processes at the same time (one read it as it was unlinked).
    bad = PACKAGE / "_runtime" / "_reach_probe_for_test.py"
    source = "from .._os._syscalls import rename\nfrom .. import _tree\n"
    found = [m for m, names in _imports(bad, source) if m.startswith("fsjobstore.") and m.split(".")[1] not in UPPER]
    found += [n for m, names in _imports(bad, source) if m == "fsjobstore" for n in names if n.startswith("_")]
    assert found == ["fsjobstore._os._syscalls", "_tree"]


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
        "JobStore", "JobStoreError", "LeaseLost", "Limit", "LogLine", "NotificationLease", "Progress",
        "QuarantinedFile", "QueueCounters",
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


def test_no_module_of_machinery_is_longer_than_one_sitting() -> None:
    long = {p.relative_to(PACKAGE).as_posix(): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 520}
    assert set(long) <= set(FACADES), long


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def _targets(module: str, names: list[str]) -> list[str]:
    """What an import brings in: each name that is itself a module of the package (``from . import
    _args``), and the module it is from when anything else is named."""
    def is_module(name: str) -> bool:
        base = PACKAGE.parent / name.replace(".", "/")
        return base.is_dir() or base.with_suffix(".py").exists()

    modules = [f"{module}.{n}" for n in names if is_module(f"{module}.{n}")]
    return modules if names and len(modules) == len(names) else [module, *modules]


def upward_imports(files: list[Path]) -> list[str]:
    offences = []
    for path in files:
        here = _layer(_module_name(path))
        if here is None:
            continue
        for module, names in _imports(path):
            for target in _targets(module, names):
                there = _layer(target)
                if target.startswith("fsjobstore.") and there is None:
                    offences.append(f"{_module_name(path)} imports {target}, above every layer")
                elif there is not None and there > here:
                    offences.append(f"{_module_name(path)} imports {target} from a layer above it")
    return offences


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_each_layer_imports_only_the_layers_beneath_it() -> None:
    assert all((PACKAGE / name).is_dir() for name in LAYERS[1:]), "a layer is a package of its own"
    assert upward_imports(package_files()) == []


def test_the_layer_order_check_notices_an_upward_import() -> None:
    bad = PACKAGE / "_core" / "_upward_probe_for_test.py"
    bad.write_text("from .._transitions._work import Work\n"
                   "from .._store import _jobstore\n"
                   "from ..worker import Worker\n")
    try:
        assert upward_imports([bad]) == [
            "fsjobstore._core._upward_probe_for_test imports fsjobstore._transitions._work from a layer above it",
            "fsjobstore._core._upward_probe_for_test imports fsjobstore._store._jobstore from a layer above it",
            "fsjobstore._core._upward_probe_for_test imports fsjobstore.worker, above every layer",
        ]
    finally:
        bad.unlink()


def import_circles(files: list[Path]) -> list[list[str]]:
    """Groups of the package's modules that import each other, directly or around a circle
    (late imports inside functions count: they are a circle held apart, not a layer)."""
    known = {_module_name(p) for p in files}
    graph = {_module_name(p): {t for m, names in _imports(p) for t in _targets(m, names)
                               if t in known and t != _module_name(p) and t != "fsjobstore"} for p in files}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_two_modules_import_each_other_even_late() -> None:
    assert import_circles(package_files()) == []


def test_the_circle_check_notices_two_modules_that_import_each_other() -> None:
    a, b = PACKAGE / "_cli" / "_circle_probe_a.py", PACKAGE / "_cli" / "_circle_probe_b.py"
    a.write_text("def f():\n    from ._circle_probe_b import g\n")
    b.write_text("from ._circle_probe_a import f\n")
    try:
        assert import_circles([a, b]) == [["fsjobstore._cli._circle_probe_a", "fsjobstore._cli._circle_probe_b"]]
    finally:
        a.unlink()
        b.unlink()


def test_no_two_modules_share_a_name() -> None:
    seen: dict[str, list[str]] = {}
    for p in package_files():
        if p.name != "__init__.py":
            seen.setdefault(p.stem, []).append(p.relative_to(PACKAGE).as_posix())
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}
