"""The transitions of FORMAT.md: create, claim and commit, notify, by id, take-over, recovery, removal,
retention, purge, listing and statistics.
"""
