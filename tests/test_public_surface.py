"""What ``import fsjobstore`` gives a user: every documented name, and no more cost than the store's."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fsjobstore
from fsjobstore import InvalidQueueName, InvalidRequest, JobStore, check_queue_name


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout


def test_importing_fsjobstore_does_not_import_the_worker_runtime() -> None:
    out = _python("import sys, fsjobstore; print(sorted(m for m in sys.modules if m.startswith('fsjobstore.')))")
    assert "fsjobstore.worker" not in out and "fsjobstore._runtime" not in out, out


def test_the_runtime_names_load_on_first_use_and_are_the_worker_modules_own() -> None:
    out = _python(
        "import fsjobstore, fsjobstore.worker as w\n"
        "print(all(getattr(fsjobstore, n) is getattr(w, n) for n in ('Worker', 'JobContext', 'Deliverer', "
        "'RunSummary')))\n"
        "from fsjobstore import Deliverer, RunSummary; print(Deliverer.__name__, RunSummary.__name__)")
    assert out.split() == ["True", "Deliverer", "RunSummary"]


def test_dir_lists_the_lazily_loaded_names_and_an_unknown_name_is_an_attribute_error() -> None:
    assert {"Worker", "JobContext", "Deliverer", "RunSummary", "check_queue_name"} <= set(dir(fsjobstore))
    with pytest.raises(AttributeError, match="no attribute 'Wroker'"):
        fsjobstore.Wroker  # noqa: B018


def test_check_queue_name_returns_a_good_name_and_names_what_is_wrong_with_a_bad_one() -> None:
    assert check_queue_name("images-2") == "images-2"
    assert check_queue_name("q" * 64) == "q" * 64
    cases = [
        ("a.b", "queue 'a.b' is not a queue name: use ASCII letters"),
        ("", "queue '' is not a queue name: it is empty"),
        ("q" * 65, "it is 65 characters long; the limit is 64"),
        ("-x", "is not a queue name"),
        ("é", "is not a queue name"),
        ("x\n", "is not a queue name"),
    ]
    for bad, message in cases:
        with pytest.raises(InvalidQueueName, match=message):
            check_queue_name(bad)
    with pytest.raises(InvalidQueueName, match=r"--queue must be a str \(a queue name\), not int"):
        check_queue_name(3, "--queue")
    assert issubclass(InvalidQueueName, InvalidRequest) and issubclass(InvalidQueueName, ValueError)


def test_the_store_and_the_file_grammar_use_the_same_queue_rule(tmp_path: object) -> None:
    from fsjobstore._format import _layout
    from fsjobstore._format import _values as _codec
    assert _layout.QUEUE_RE is _codec.QUEUE_NAME_RE
    with JobStore(str(tmp_path) + "/s") as store:
        with pytest.raises(InvalidQueueName, match="queue 'a b' is not a queue name"):
            store.create("x", queue="a b")
        assert store.create("x", queue="q" * 64).queue == "q" * 64


def test_the_exceptions_page_names_the_builtin_each_error_also_is() -> None:
    # From a new user's trial: the error list named no builtin for JobExists, so
    # `except ValueError` catching it came as a surprise.
    import builtins
    import os
    import re

    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "reference", "exceptions.md")) as fh:
        listed = fh.read().split("Errors (all under `JobStoreError`", 1)[1].split("##", 1)[0]
    listed = " ".join(listed.split())
    for name in dir(fsjobstore):
        error = getattr(fsjobstore, name)
        if not (isinstance(error, type) and issubclass(error, fsjobstore.JobStoreError)) or name == "JobStoreError":
            continue
        own = [b.__name__ for b in error.__bases__ if getattr(builtins, b.__name__, None) is b]
        assert f"`{name}`" in listed, name
        for builtin in own:
            assert re.search(rf"`{name}` \(`{builtin}`", listed), (name, builtin)
