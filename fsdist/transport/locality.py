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
from ..fs.mounts import is_local

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
    #: records may be read without the lock first (torn reads retried): one local client, where
    #: a read costs no server round trip and a write is seen at once, or direct records, which
    #: have no lock
    optimistic: bool = field(init=False)
    #: a peer's message may be mapped instead of copied (worth it for large parts)
    maps_messages: bool = field(init=False)

    def __post_init__(self) -> None:  # plain fields: the hot path reads them without a call
        object.__setattr__(self, "optimistic", (self.one_client and self.local) or self.direct)
        object.__setattr__(self, "maps_messages", self.reuse_files)

    @classmethod
    def of(cls, directory: str, one_client: bool, chosen: bool = False) -> Locality:
        """``directory``'s locality; FSDIST_REUSE_FILES=0/1 overrides whether files are reused.
        Records are direct where FSDIST_IO=direct (wherever the filesystem takes it), or where it
        is auto and ``chosen`` (the job measured that direct records hold across its clients:
        job/io_choice.py; a node's own tier is never chosen: one client, no round trips to save)."""
        local = is_local(directory)
        setting = os.environ.get(ENV_REUSE_FILES, "")
        io = io_setting()
        direct = io == "direct" or (io == "auto" and chosen)
        probed = directory
        while not os.path.isdir(probed) and os.path.dirname(probed) != probed:
            probed = os.path.dirname(probed)  # (a group's folder is made after this: its parent's filesystem)
        if direct and (why := DirectRecord.refusal(probed)) is not None:
            if not (one_client and local):  # (one machine's own folder: every rank finds the same)
                raise FsdistError(f"{ENV_IO}=direct: {directory}: {why}; use {ENV_IO}=locked (or auto) there")
            direct = False  # a node tier on a kernel whose tmpfs has no direct I/O: locked, as before
        return cls(one_client, local, setting == "1" if setting in ("0", "1") else local, direct)
