"""A group's ``abort`` record: why the group failed, written once by the first rank to fail and
read by every rank that waits, so every wait ends with that reason instead of a timeout.

A rank that aborts also sets FLAG_ABORTED in its state record, and so does every rank that
fails on seeing it: the flag spreads along every pair of ranks that read each other's records,
so a rank that read a peer's record since it last asked has heard of an abort already and
need not read this file (``known``); one that reads no records (a broadcast root, a sender
only) reads it. In a group whose records take no lock it is looked at as they are read first
(one READ on NFS, where the locked read is LOCK, GETATTR, READ, UNLOCK): empty, nobody aborted;
only a written one (or one being written) is read under the lock, as the writer writes it.
"""

from __future__ import annotations

import os

from ..files.locks import LockedRecord
from ..protocol import layout
from ..protocol.sealed import seal_text, unseal_text

__all__ = ["AbortRecord"]


class AbortRecord:
    """The group's abort record (sealed text: protocol/sealed.py)."""

    def __init__(self, directory: str, record_kind: type[LockedRecord] = LockedRecord) -> None:
        """``record_kind``: the group's records' (Locality.record_kind)."""
        self._record = LockedRecord(os.path.join(directory, layout.ABORT_FILE))  # (changed by any rank: locked)
        self._identity = layout.identity(self._record.path)
        #: where the group's records take no lock, the same file read as they are (no lock), to
        #: see that it is empty: a look costs a READ, not LOCK, GETATTR, READ and UNLOCK
        self._glance = record_kind(self._record.path, create=False) if record_kind.lockless else None
        #: whether a peer's record was read since ``known`` last asked
        self.records_read = False

    def mark(self, reason: str) -> None:
        """Record ``reason`` unless a reason is recorded already (the first failure wins)."""
        self._record.update(lambda old: None if old else seal_text(reason, self._identity))

    def reason(self) -> str | None:
        """Why the group was aborted, or None where it was not."""
        if self._glance is not None and not self._glance.read():
            return None
        raw = self._record.read()
        if not raw:
            return None
        try:
            return unseal_text(raw, self._identity)
        except ValueError as exc:  # written, so the group is over; by whom and why cannot be told
            return f"(its abort record {self._record.path} holds no readable reason: {exc})"

    def known(self) -> str | None:
        """The reason, as far as this rank must look for it now (see the module's docstring)."""
        if self.records_read:
            self.records_read = False
            return None
        return self.reason()

    def close(self) -> None:
        self._record.close()
        if self._glance is not None:
            self._glance.close()
