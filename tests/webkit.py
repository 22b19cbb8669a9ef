"""Helpers for the web tests: an app on a store, a client whose every answer is checked against
the app's own OpenAPI document, and CSRF-carrying form posts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the web extra is not installed: pip install -e '.[test]'")

import jsonschema
from fastapi.testclient import TestClient

from fsjobstore import JobStore
from fsjobstore.web import create_app


class CheckedClient:
    """A TestClient whose every answer under ``/api`` must be documented in ``/openapi.json``
    (its path, method and status) and match the documented schema; it remembers what it saw, so
    a test can say that every operation was exercised."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.spec = client.app.openapi()  # what /openapi.json serves (which may need a token)
        self.seen: set[tuple[str, str, int]] = set()
        self._routes = [(re.compile("^" + re.sub(r"\{[^/]+\}", "[^/]+", path) + "$"), path)
                        for path in self.spec["paths"]]

    def template(self, url: str) -> str:
        path = url.split("?", 1)[0]
        for rx, tpl in self._routes:
            if rx.match(path):
                return tpl
        raise AssertionError(f"{path} is not in the OpenAPI document")

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        response = self.client.request(method, url, **kwargs)
        if url.startswith("/api/") and not url.startswith("/api/docs"):
            self.check(method, url, response)
        return response

    def check(self, method: str, url: str, response: Any) -> None:
        tpl = self.template(url)
        op = self.spec["paths"][tpl].get(method.lower())
        assert op is not None, f"{method} {tpl} is not documented"
        status = str(response.status_code)
        documented = op["responses"].get(status)
        assert documented is not None, f"{method} {tpl} answered {status}, which is not documented: {response.text}"
        schema = documented.get("content", {}).get("application/json", {}).get("schema")
        if schema is not None and response.content:
            root = {**schema, "components": self.spec.get("components", {})}
            jsonschema.Draft202012Validator(root).validate(response.json())
        self.seen.add((method.upper(), tpl, response.status_code))

    def get(self, url: str, **kwargs: Any) -> Any:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> Any:
        return self.request("POST", url, **kwargs)


@contextmanager
def web_app(store: JobStore, **options: Any) -> Iterator[CheckedClient]:
    with TestClient(create_app(store, **options)) as client:
        yield CheckedClient(client)


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "the page has no CSRF field"
    return m.group(1)
