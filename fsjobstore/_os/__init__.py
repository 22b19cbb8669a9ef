"""The OS door: system calls beneath the store's root, no-follow resolution, durable file operations, inotify,
and the checks of what a filesystem can do.
"""
