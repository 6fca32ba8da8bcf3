"""One small error hierarchy, so callers can catch by kind and every message names where it was.

Each error says which rank saw it, in which operation, at which sequence number, and what it
was waiting for: a distributed failure that only says "timed out" costs hours to diagnose.
"""

from __future__ import annotations

__all__ = [
    "DesyncError",
    "FsdistError",
    "FsdistTimeoutError",
    "GroupBrokenError",
    "PeerFailedError",
    "ProtocolError",
    "RendezvousError",
    "UntrustedPathError",
]


class FsdistError(RuntimeError):
    """Base class of every error fsdist raises on purpose."""


class FsdistTimeoutError(FsdistError, TimeoutError):
    """A wait ran past the group's timeout."""


class PeerFailedError(FsdistError):
    """A peer died, closed the group, or reported an abort while this rank waited for it."""


class DesyncError(FsdistError):
    """Ranks called different operations (or the same one with different shape, dtype, op or root)."""


class ProtocolError(FsdistError):
    """A file in the run directory is truncated, foreign, or of another protocol version."""


class UntrustedPathError(ProtocolError):
    """A path fsdist would adopt is not this user's (or FSDIST_GROUP's) alone: another user made
    it, can write it, or it is not the kind of file it should be (files/trust.py)."""


class RendezvousError(FsdistError):
    """The ranks could not form a job in the directory (another live job, bad arguments, ...)."""


class GroupBrokenError(FsdistError):
    """An earlier error left this group unusable; every later call raises this."""
