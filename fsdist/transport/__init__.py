"""Layer 4: one process group's channels over files: the declared interfaces the algorithms may use
(interfaces.py), their file implementation and an in-memory one for tests.
"""
