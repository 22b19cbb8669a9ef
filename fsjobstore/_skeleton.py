"""Opening a store: its root, its directories, and the marker file that says it is a store."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from . import _fsops as fs
from ._codec import dumps
from ._errors import StoreFormatError, UntrustedStore
from ._layout import FORMAT_VERSION, Layout


def open_tree(layout: Layout, *, durable: bool, new_token: Callable[[], str]) -> None:
    fs.makedirs(layout.root)
    if not fs.is_real_dir(layout.root):
        raise UntrustedStore(f"{layout.root} exists and is not a directory")
    fs.check_trusted(layout.root)
    for directory in layout.all_dirs():
        fs.ensure_dir(directory, durable=durable)
        fs.check_trusted(directory)
    _check_marker(layout, durable=durable, new_token=new_token)


def _check_marker(layout: Layout, *, durable: bool, new_token: Callable[[], str]) -> None:
    try:
        data = fs.read_regular(layout.marker, 65536)
    except FileNotFoundError:
        tmp = layout.tmp_path(new_token(), "aux", "marker")
        fs.write_new(tmp, dumps({"format": FORMAT_VERSION, "created_at": time.time()}) + b"\n", durable=durable)
        try:
            fs.link_into(tmp, layout.marker, durable=durable)
        except FileExistsError:
            pass  # another process initialised the store at the same moment
        finally:
            fs.unlink(tmp)
        data = fs.read_regular(layout.marker, 65536)
    except fs.Unreadable as exc:
        raise StoreFormatError(f"{layout.marker} {exc}") from None
    try:
        version = json.loads(data).get("format")
    except (ValueError, AttributeError):
        raise StoreFormatError(f"{layout.marker} is not valid JSON") from None
    if version != FORMAT_VERSION:
        raise StoreFormatError(
            f"{layout.root} holds a format {version!r} store; this fsjobstore reads format {FORMAT_VERSION}"
        )
