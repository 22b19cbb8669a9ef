"""The on-disk format (FORMAT.md): JSON values, names and paths, job records, the ``Job`` users see, and the
checks of what callers hand in.
"""
