"""The loopback GlusterFS test bed: see README.md."""
