"""What plugs fsjobstore into other projects, each an optional extra built on the public API only.

- :mod:`fsjobstore.contrib.kombu`: a kombu transport, so Celery (or any kombu user) can use a
  directory as its broker: ``fsjobstore:///var/lib/myapp/jobs``.
- :mod:`fsjobstore.contrib.celery`: a Celery result backend on the same directory.

Install with ``pip install "fsjobstore[celery]"``. The guide "Celery on a directory" says what maps
and what does not.
"""
