"""docs/explanation/architecture.md is the map of the code: it must name every module, and nothing that is gone."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import fsjobstore
from fsjobstore._core._hooks import Hooks

PACKAGE = Path(fsjobstore.__file__).parent
MAP = PACKAGE.parent / "docs" / "explanation" / "architecture.md"


def modules() -> set[str]:
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


def named_in_map(text: str) -> set[str]:
    """The modules the map names as `path.py` (relative to the package)."""
    found = set(re.findall(r"`((?:_?[a-z]+/)?_{0,2}[a-z_]+\.py)`", text))
    return {path for path in found if "/" not in path or (PACKAGE / path.split("/")[0]).is_dir()}


def test_the_map_names_every_module_of_the_package_and_no_module_that_is_gone() -> None:
    named = named_in_map(MAP.read_text())
    assert sorted(modules() - named) == [], "a module missing from docs/explanation/architecture.md"
    assert sorted(named - modules()) == [], "docs/explanation/architecture.md names a module that does not exist"


def test_the_map_check_notices_a_missing_module() -> None:
    text = MAP.read_text().replace("`_core/_tree.py`", "the tree")
    assert "_core/_tree.py" in modules() - named_in_map(text)


def test_the_map_lists_every_named_point_of_the_transitions() -> None:
    table = MAP.read_text().split("## Named points", 1)[1].split("##", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)?", table, re.M))
    points = {name for pair in listed for name in pair if name}
    assert points == {f.name for f in dataclasses.fields(Hooks)}


def code_references(text: str) -> set[str]:
    """The references to code in a document: `_layer._module.name...`, as FORMAT.md writes them."""
    layers = "|".join(p.name for p in PACKAGE.iterdir()
                      if p.is_dir() and p.name.startswith("_") and p.name != "__pycache__")
    return set(re.findall(rf"`((?:{layers})\.[A-Za-z_][A-Za-z0-9_.]*)", text))


def unresolved(references: set[str]) -> list[str]:
    import importlib

    missing = []
    for ref in sorted(references):
        parts = ref.rstrip(".").split(".")
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a module, then attributes
            try:
                obj: object = importlib.import_module("fsjobstore." + ".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            try:
                for name in parts[cut:]:
                    obj = getattr(obj, name)
            except AttributeError:
                missing.append(ref)
            break
        else:
            missing.append(ref)
    return missing


def test_every_reference_to_code_in_the_format_and_the_readme_names_code_that_exists() -> None:
    docs = PACKAGE.parent / "docs"
    pages = [p for p in docs.rglob("*.md") if not p.relative_to(docs).parts[0].startswith("_")]
    for doc in [PACKAGE.parent / "FORMAT.md", PACKAGE.parent / "README.md", PACKAGE.parent / "MULTIHOST.md", *pages]:
        refs = code_references(doc.read_text())
        assert unresolved(refs) == [], doc
    assert len(code_references((PACKAGE.parent / "FORMAT.md").read_text())) >= 40


def test_the_reference_check_notices_code_that_moved() -> None:
    assert unresolved({"_transitions._work.Work.claim", "_core._tree.Tree"}) == []
    assert unresolved({"_transitions._work.Work.no_such_method", "_core._nowhere.Thing"}) == [
        "_core._nowhere.Thing", "_transitions._work.Work.no_such_method"]
