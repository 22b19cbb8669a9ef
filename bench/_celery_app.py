"""The Celery app of bench/celery_peers.py: imported by its client (a process forked per cell) and by its
``celery worker`` (``-A _celery_app``), which finds the transport and the cell's directory in the
environment (``BENCH_CELERY_TRANSPORT``, ``BENCH_CELERY_DIR``, ``BENCH_CELERY_REDIS``)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

# Names the fsjobstore:// URL in kombu (an installed wheel's .pth does it; an editable install does not).
import fsjobstore.contrib.kombu  # noqa: F401

TRANSPORTS = ("fsjobstore", "fsjobstore-nosync", "filesystem", "redis")
WITH_RESULTS = ("fsjobstore", "fsjobstore-nosync", "redis")  # the others have no result backend here
ENV_TRANSPORT, ENV_DIR, ENV_REDIS = "BENCH_CELERY_TRANSPORT", "BENCH_CELERY_DIR", "BENCH_CELERY_REDIS"
EFFECTS = "effects.log"
LINE = 9  # bytes a bump appends: eight digits and a newline


def make_app(transport: str, root: str, redis_url: str | None = None) -> Celery:
    app = Celery("bench_celery")
    if transport.startswith("fsjobstore"):
        url = f"fsjobstore://{os.path.join(root, 'store')}"
        app.conf.update(broker_url=url, result_backend=url)
        if transport == "fsjobstore-nosync":
            # The first opener makes the store, and records durable=False in it.
            options = {"durable": False}
            app.conf.update(broker_transport_options=options, result_backend_transport_options=options)
    elif transport == "filesystem":
        data, control = os.path.join(root, "broker"), os.path.join(root, "control")
        for folder in (data, control):  # kombu's filesystem transport makes neither
            os.makedirs(folder, exist_ok=True)
        app.conf.update(broker_url="filesystem://", broker_transport_options={
            "data_folder_in": data, "data_folder_out": data, "control_folder": control})
    elif transport == "redis":
        if not redis_url:
            raise ValueError("the redis transport needs a server's URL")
        app.conf.update(broker_url=f"{redis_url}/0", result_backend=f"{redis_url}/1")
    else:
        raise ValueError(f"unknown transport {transport!r}: one of {', '.join(TRANSPORTS)}")
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    effects = os.path.join(root, EFFECTS)

    @app.task(name="bench.bump")
    def bump(i: int) -> None:
        """The trivial task: its side effect, one short O_APPEND write, counts its executions."""
        fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{i % 10**8:08d}\n".encode())
        finally:
            os.close(fd)

    @app.task(name="bench.add")
    def add(x: Any, y: Any) -> Any:
        return x + y

    return app


app = (make_app(os.environ[ENV_TRANSPORT], os.environ[ENV_DIR], os.environ.get(ENV_REDIS))
       if ENV_DIR in os.environ else None)


def group_alive(pgid: int) -> bool:
    """Whether a process of the group is still running (zombies not counted: the machine's init
    may never reap the pool's orphans)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
