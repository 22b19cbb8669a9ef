"""The store users hold: ``JobStore``, its background thread, and the blocking waits.
"""
