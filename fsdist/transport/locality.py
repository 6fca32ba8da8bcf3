"""What a group's directory is to its ranks, found once when the group is made.

Every choice that depends on where the files live reads it here, so no part of the transport
asks the filesystem again or decides apart from the others: whether a step can wake every
waiter, whether records are direct or read without the lock first, whether retired message
files are rewritten and peers' files mapped, and which small all_reduce the algorithms run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..defaults import ENV_IO, ENV_REUSE_FILES
from ..errors import FsdistError
from ..files.direct import DirectRecord, io_setting
from ..files.locks import LockedRecord, OptimisticRecord
from ..fs.mounts import is_local
from ..job.io_choice import Choice

__all__ = ["Locality"]


@dataclass(frozen=True)
class Locality:
    #: every rank reaches the directory through one client (one kernel, one mount), so a rank's
    #: step can wake every waiter and no wait polls; the same on every rank (it comes from the
    #: rendezvous record), so algorithms may choose by it
    one_client: bool
    #: the directory is on this machine's own filesystem (tmpfs, a local disk)
    local: bool
    #: retired message files are rewritten (spares, ring files) and peers' files mapped; on a
    #: network filesystem another client may cache a rewritten file's old pages (default
    #: GlusterFS does; NFS revalidates on open, but only as finely as its change attribute), so
    #: a fresh file per message is the path that is correct everywhere
    reuse_files: bool
    #: state records are read and written with O_DIRECT and no lock (files/direct.py
    #: DirectRecord): FSDIST_IO=direct, where the filesystem takes unaligned direct I/O
    direct: bool = False
    #: the class of the group's records, the one place it is picked: direct ones; else read
    #: without the lock first (torn reads read again locked) on one local client, where a read
    #: costs no server round trip and a write is seen at once; else locked
    record_kind: type[LockedRecord] = field(init=False)
    #: records may be read without the lock (``record_kind.reads_unlocked``)
    optimistic: bool = field(init=False)
    #: no lock guards them (``record_kind.lockless``): a read may meet a write halfway, and each
    #: look at a peer is a round trip to the server, not a lock's revalidation
    lockless: bool = field(init=False)
    #: a peer's message may be mapped instead of copied (worth it for large parts)
    maps_messages: bool = field(init=False)

    def __post_init__(self) -> None:  # plain fields: the hot path reads them without a call
        kind = DirectRecord if self.direct else OptimisticRecord if self.one_client and self.local else LockedRecord
        object.__setattr__(self, "record_kind", kind)
        object.__setattr__(self, "optimistic", kind.reads_unlocked)
        object.__setattr__(self, "lockless", kind.lockless)
        object.__setattr__(self, "maps_messages", self.reuse_files)

    @classmethod
    def of(cls, directory: str, one_client: bool, records: Choice | None = None) -> Locality:
        """``directory``'s locality; FSDIST_REUSE_FILES=0/1 overrides whether files are reused.
        Records are direct where the job's ``records`` are (job/io_choice.py: FSDIST_IO=direct, or
        auto where it measured that direct records hold across its clients); a node's own tier
        passes none: direct only where FSDIST_IO=direct (one client, no round trips to save)."""
        local = is_local(directory)
        setting = os.environ.get(ENV_REUSE_FILES, "")
        io = io_setting()
        direct = records.direct if records is not None else io == "direct"  # (the job's choice read FSDIST_IO)
        probed = directory
        while not os.path.isdir(probed) and os.path.dirname(probed) != probed:
            probed = os.path.dirname(probed)  # (a group's folder is made after this: its parent's filesystem)
        if direct and (why := DirectRecord.refusal(probed)) is not None:
            if not (one_client and local):  # (one machine's own folder: every rank finds the same)
                raise FsdistError(f"{ENV_IO}=direct: {directory}: {why}; use {ENV_IO}=locked (or auto) there")
            direct = False  # a node tier on a kernel whose tmpfs has no direct I/O: locked, as before
        return cls(one_client, local, setting == "1" if setting in ("0", "1") else local, direct)
