"""Run by .ci/run in a fresh virtualenv holding the built wheel with its ``celery`` extra: the
``fsjobstore://`` URL works in kombu and Celery with no import of fsjobstore in the user's code (the
wheel's .pth file), and that file costs an interpreter that never imports kombu nothing but its
finder (fsjobstore is not imported at startup)."""

from __future__ import annotations

import subprocess
import sys
import tempfile

with tempfile.TemporaryDirectory() as tmp:
    startup = subprocess.run([sys.executable, "-c", "import sys; print('fsjobstore' in sys.modules)"],
                             capture_output=True, text=True, check=True)
    assert startup.stdout.strip() == "False", "the .pth file imported fsjobstore at startup"

    import kombu

    with kombu.Connection(f"fsjobstore://{tmp}/jobs") as conn:
        queue = conn.SimpleQueue("hello")
        queue.put({"from": "the wheel"})
        message = queue.get(timeout=10)
        assert message.payload == {"from": "the wheel"}, message.payload
        message.ack()

    from celery import Celery

    app = Celery("check", broker=f"fsjobstore://{tmp}/jobs", backend=f"fsjobstore://{tmp}/jobs")
    assert type(app.backend).__name__ == "FSJobStoreBackend", type(app.backend)
    app.backend.store_result("t1", 5, "SUCCESS")
    assert app.AsyncResult("t1").get(timeout=10) == 5
print("celery extra: the fsjobstore:// URL works in kombu and Celery from the wheel")
