"""The core of one open store: its shared state, the tree of job files and finding one by id, the pending index,
liveness, the doorbell, counters, and opening a directory as a store.
"""
