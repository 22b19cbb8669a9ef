"""Pages of the reference generated from the code at build time, so they cannot drift from it:
the command line from its argument parsers, the HTTP API from the app's OpenAPI document, the exit
codes from their module, the performance charts from the last benchmark run's JSON. Written into
``docs/_generated/`` (not kept in git) before the build reads any page; the pages include them."""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from typing import Any

_OUT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "_generated")


def _write(name: str, text: str) -> None:
    os.makedirs(_OUT, exist_ok=True)
    path = os.path.join(_OUT, name)
    old = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            old = fh.read()
    if old != text:  # unchanged files keep their mtime: Sphinx rebuilds only what changed
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)


def _fence(text: str) -> str:
    return "```text\n" + text.rstrip() + "\n```\n"


def cli_page() -> str:
    from fsjobstore._cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal's width: a fixed one here
    parser = build_parser()
    parser.prog = "fsjobstore"
    out = ["# `fsjobstore`\n", _fence(parser.format_help())]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    seen: set[int] = set()
    for name, sub in subparsers.choices.items():
        if id(sub) in seen:  # an alias
            continue
        seen.add(id(sub))
        out += [f"# `fsjobstore {name}`\n", _fence(sub.format_help())]
        nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        for action in nested:
            for sname, ssub in action.choices.items():
                out += [f"## `fsjobstore {name} {sname}`\n", _fence(ssub.format_help())]
    return "\n".join(out)


def exit_codes_page() -> str:
    """The table ``fsjobstore --help`` ends with, as a table: one place says what each code means."""
    import re

    from fsjobstore._cli._args import EXIT_CODES

    rows: list[list[str]] = []
    for line in EXIT_CODES.splitlines()[1:]:  # after its "exit codes:" line
        m = re.match(r"  (\d+)\s+(.*)", line)
        if m:
            rows.append([m[1], m[2].strip()])
        elif rows:
            rows[-1][1] += " " + line.strip()
    assert rows, "fsjobstore --help lists no exit codes"
    return "\n".join(["| code | meaning |", "|---|---|", *(f"| {c} | {_cell(t)} |" for c, t in rows)]) + "\n"


def exception_tree_page() -> str:
    """The tree drawn in ``fsjobstore._errors``' docstring: one place says it."""
    from fsjobstore import _errors

    doc = _errors.__doc__ or ""
    tree = doc.split("::\n", 1)[1].strip("\n").split("\n\n", 1)[0]
    return _fence("\n".join(line[4:] for line in tree.splitlines()))


def _schema_name(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref")
    if ref:
        return f"`{ref.rsplit('/', 1)[-1]}`"
    if schema.get("type") == "array":
        return f"array of {_schema_name(schema.get('items', {}))}"
    if "anyOf" in schema:
        return " or ".join(_schema_name(s) for s in schema["anyOf"])
    return f"`{schema.get('type', 'any')}`"


def _bounds(schema: dict[str, Any]) -> str:
    """A number's or a text's limits, as the document gives them: `` (1 to 1000)``."""
    low = schema.get("minimum", schema.get("exclusiveMinimum", schema.get("minLength")))
    high = schema.get("maximum", schema.get("exclusiveMaximum", schema.get("maxLength")))
    if low is None and high is None:
        for option in schema.get("anyOf", []):
            if option.get("type") != "null":
                return _bounds(option)
        return ""
    if low is None:
        return f" (at most {high})"
    return f" (at least {low})" if high is None else f" ({low} to {high})"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def openapi() -> dict[str, Any]:
    """The API's OpenAPI document, from an app on an empty store."""
    from fsjobstore import JobStore
    from fsjobstore.web import create_app

    with tempfile.TemporaryDirectory() as tmp:
        store = JobStore(os.path.join(tmp, "store"))
        try:
            doc: dict[str, Any] = create_app(store).openapi()
        finally:
            store.close()
    return doc


def http_page(doc: dict[str, Any]) -> str:
    out = [f"OpenAPI {doc['openapi']}; the running server serves this document at `/openapi.json` "
           "and an interactive page at `/api/docs`.\n"]
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            out.append(f"# `{method.upper()} {path}`\n")
            if op.get("summary"):
                out.append(f"**{_cell(op['summary'])}**\n")
            if op.get("description"):
                out.append(op["description"].strip() + "\n")
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | required | type | default | description |", "|---|---|---|---|---|---|"]
                for p in params:
                    schema = p.get("schema", {})
                    default = f"`{json.dumps(schema['default'])}`" if "default" in schema else ""
                    out.append(f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} | "
                               f"{_schema_name(schema)}{_bounds(schema)} | {default} | "
                               f"{_cell(p.get('description', ''))} |")
                out.append("")
            body = op.get("requestBody", {}).get("content", {})
            for ctype, media in body.items():
                out.append(f"Request body ({ctype}): {_schema_name(media.get('schema', {}))}\n")
            out += ["| status | meaning |", "|---|---|"]
            for code, resp in op.get("responses", {}).items():
                out.append(f"| {code} | {_cell(resp.get('description', ''))} |")
            out.append("")
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        out.append("# Schemas\n")
        for name, schema in schemas.items():
            out.append(f"## `{name}`\n")
            if schema.get("description"):
                out.append(schema["description"].strip() + "\n")
            props = schema.get("properties", {})
            if props:
                required = set(schema.get("required", []))
                out += ["| field | type | required | description |", "|---|---|---|---|"]
                for pname, prop in props.items():
                    out.append(f"| `{pname}` | {_schema_name(prop)} | {'yes' if pname in required else 'no'} | "
                               f"{_cell(prop.get('description', ''))} |")
                out.append("")
    return "\n".join(out)


def charts() -> None:
    """The performance page's charts, drawn by bench/charts.py from the last peers run's JSON."""
    import importlib.util

    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "bench")
    spec = importlib.util.spec_from_file_location("fsjobstore_bench_charts", os.path.join(bench, "charts.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write(os.path.join(bench, "last_peers_run.json"), os.path.join(_OUT, "charts"))


def generate(app: Any = None) -> None:
    logging.getLogger("fsjobstore").setLevel(logging.WARNING)  # the stores made here say nothing
    charts()
    _write("cli.md", cli_page())
    _write("exit-codes.md", exit_codes_page())
    _write("exception-tree.md", exception_tree_page())
    _write("http.md", http_page(openapi()))


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
