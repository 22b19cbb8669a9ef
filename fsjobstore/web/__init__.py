"""fsjobstore.web: a store's dashboard, JSON API and Prometheus metrics, as one ASGI app.

    pip install "fsjobstore[web]"
    fsjobstore web ./jobs                      # http://127.0.0.1:8650/

or, in your own ASGI application::

    from fsjobstore.web import create_app
    app.mount("/jobs", create_app(store))      # a JobStore, or a path

Built on fsjobstore's public API only, like any user's code would be (a test checks). The
dashboard's pages are server-rendered (Jinja2) with a small script of their own for live updates;
nothing is fetched from the internet. The API is described at ``/openapi.json`` and ``/api/docs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._metrics import StoreCollector, registry_for  # prometheus-client only: what a worker's --metrics-port needs

if TYPE_CHECKING:
    from ._app import create_app

__all__ = ["StoreCollector", "create_app", "registry_for"]


def __getattr__(name: str) -> Any:
    """``create_app`` needs FastAPI and Jinja2 too: loaded on first use, with a clear error
    when the extra is not installed."""
    if name != "create_app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from ._app import create_app
    except ImportError as exc:
        raise ImportError(f"fsjobstore.web needs the web extra: pip install 'fsjobstore[web]' "
                          f"({exc.name} is missing)", name=exc.name) from exc
    globals()["create_app"] = create_app
    return create_app
