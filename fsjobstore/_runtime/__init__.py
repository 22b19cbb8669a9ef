"""The worker runtime's machinery (public face: ``fsjobstore.worker``).
"""
