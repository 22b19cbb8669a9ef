"""Run at interpreter start by the wheel's ``fsjobstore-kombu.pth`` (setup.py writes it from this
file): when kombu's transport table is first imported, add ``fsjobstore`` to it, so the
``fsjobstore://`` URL works in kombu and Celery with no import of ours in the user's code.

It imports nothing of fsjobstore's, and nothing at all until kombu is imported: a finder that
answers for ``kombu.transport`` only, once, then steps aside.
"""

import sys


class _KombuTransportAlias:
    @classmethod
    def find_spec(cls, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name != "kombu.transport":
            return None
        sys.meta_path.remove(cls)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            run(module)
            module.TRANSPORT_ALIASES.setdefault("fsjobstore", "fsjobstore.contrib.kombu:Transport")

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if "kombu.transport" not in sys.modules and _KombuTransportAlias not in sys.meta_path:
    sys.meta_path.insert(0, _KombuTransportAlias)
