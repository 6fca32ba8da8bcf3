"""Spare message files: retired files a rank keeps, mapped, and rewrites in place.

Why: on tmpfs, filling a fresh file runs at ~2.3 GB/s here (the kernel zeroes every new page,
then copies into it), rewriting an allocated file through ``write`` at ~4–5 GB/s, and copying
into a mapping that stays in place at memcpy speed. Unlinking a large file costs its pages'
release too. So on local filesystems a rank keeps a few retired message files as *spares*:
a message published through one is a memcpy into the rank's kept mapping of it
(files/mapped.py, by inode: it survives the renames, and the file's trips to a peer and back)
followed by the same ``rename`` into place as a fresh file, so readers see the same
all-or-nothing publication.

A file becomes a spare only when nobody can read it any more: a collective's message once
every peer has moved past its operation, a point-to-point message once its receiver consumed
it (the receiver keeps it: in a ring or a ping-pong it is the receiver that sends next). It is
renamed to a hidden name first, so no name a reader looks up leads to it.

Network filesystems never use spares (``Locality.reuse_files``): another client may
still cache the old pages of a rewritten inode.
"""

from __future__ import annotations

import errno
import os
import threading
import warnings
from collections.abc import Sequence

import torch

from ..errors import FsdistError
from ..files.io import open_file, retrying, unlink_quietly, write_all
from ..files.mapped import MappedFiles
from ..protocol import layout

__all__ = ["SpareFile", "SparePool", "torch_copy"]

_TORCH_COPY_MIN = 64 << 10


class SpareFile:
    """One spare: its current name, its size, and (once written) a descriptor open for writing.

    Its bytes are copied in through the rank's kept mapping of the file (files/mapped.py), which
    outlives the spare: the inode comes back, as this rank's next message from the peer it goes
    to, or as a spare again.
    """

    def __init__(self, path: str, size: int, mapped: MappedFiles) -> None:
        self.path = path
        self.size = size
        self._mapped = mapped
        self._fd = -1

    def publish(self, final: str, buffers: Sequence[memoryview | bytes]) -> None:
        """Copy ``buffers`` into the file from its start, then rename it to ``final``.

        A file too small grows with ``posix_fallocate`` before it is written through a mapping:
        a store into a hole of a mapped file that finds the disk full kills the process with
        SIGBUS, while ``fallocate`` fails with ENOSPC. Bytes past the message stay as they
        were: the message header says where every part lies, so a reader never reads them.
        """
        total = sum(len(b) for b in buffers)
        try:
            if self._fd < 0:
                self._fd = open_file(self.path, os.O_RDWR)
                self.size = os.fstat(self._fd).st_size
            if self.size < total:
                self._grow(total)
            if not self._mapped.write(self._fd, buffers):
                write_all(self._fd, buffers)
            retrying(lambda: os.rename(self.path, final))
        except OSError as exc:
            self.close()  # a spare that failed once (disk full, ...) is not kept
            raise FsdistError(f"could not publish {final}: {os.strerror(exc.errno or 0)} ({exc})") from exc
        self.path = final

    def _grow(self, needed: int) -> None:
        try:
            os.posix_fallocate(self._fd, 0, needed)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
                raise
            _extend_with_zeros(self._fd, self.size, needed)  # allocates too, failing cleanly
        self.size = needed

    def close(self, remove: bool = True) -> None:
        """Let go of the file (``remove``: and of its mapping, then the file itself)."""
        if self._fd >= 0:
            if remove:
                self._mapped.forget(self._fd)
            os.close(self._fd)
            self._fd = -1
        if remove:
            unlink_quietly(self.path)


def torch_copy(dest: memoryview, source: memoryview) -> None:
    """A copy between buffers for kept mappings (files/mapped.py): large ones by torch, which lets
    go of the GIL (a slice assignment would hold it for the whole memcpy, stalling this
    process's receive thread meanwhile) and uses the intra-op threads."""
    if len(dest) < _TORCH_COPY_MIN:
        dest[:] = source
        return
    with warnings.catch_warnings():  # a read-only mapping: torch warns, and only reads it
        warnings.simplefilter("ignore", UserWarning)
        torch.frombuffer(dest, dtype=torch.uint8).copy_(torch.frombuffer(source, dtype=torch.uint8))


def _extend_with_zeros(fd: int, start: int, end: int) -> None:
    zeros = bytes(1 << 20)
    while start < end:
        start += os.pwrite(fd, zeros[: min(len(zeros), end - start)], start)


class SparePool:
    """At most ``max_files`` spares of one rank in one group directory (thread-safe).

    Collectives (the group's worker thread), sends (callers' threads) and receives (the
    receive thread) all take and give back spares.
    """

    def __init__(
        self, directory: str, rank: int, enabled: bool, max_files: int, min_bytes: int, mapped: MappedFiles
    ) -> None:
        """``mapped``: the rank's kept mappings of this group's files (where spares are written)."""
        self.enabled = enabled
        self.mapped = mapped
        self._directory = directory
        self._rank = rank
        self._max_files = max_files
        self._min_bytes = min_bytes
        self._free: list[SpareFile] = []
        self._named = 0
        self._lock = threading.Lock()

    def wants(self, size: int) -> bool:
        """Whether a retired file of ``size`` bytes would be kept (worth collecting early)."""
        return self.enabled and size >= self._min_bytes and len(self._free) < self._max_files

    def free(self) -> int:
        """How many spares are free now."""
        with self._lock:
            return len(self._free)

    def take(self, size: int) -> SpareFile | None:
        """A spare for a message of ``size`` bytes: the smallest that fits, else the largest."""
        if not self.enabled or size < self._min_bytes:
            return None
        with self._lock:
            if not self._free:
                return None
            fits = [f for f in self._free if f.size >= size]
            choice = min(fits, key=lambda f: f.size) if fits else max(self._free, key=lambda f: f.size)
            self._free.remove(choice)
            return choice

    def give_back(self, path: str, size: int, spare: SpareFile | None = None) -> None:
        """Keep the file at ``path`` (nobody reads it any more) as a spare, or delete it.

        ``spare`` is the SpareFile it was published through, if it was: its mapping is kept.
        """
        if not self.wants(size):
            self._delete(path, spare)
            return
        with self._lock:
            hidden = os.path.join(self._directory, layout.spare_name(self._rank, self._named))
            self._named += 1
        try:
            os.rename(path, hidden)
        except OSError:
            self._delete(path, spare)
            return
        if spare is None:
            spare = SpareFile(hidden, size, self.mapped)
        spare.path = hidden
        with self._lock:
            if len(self._free) < self._max_files:
                self._free.append(spare)
                return
        spare.close()

    def _delete(self, path: str, spare: SpareFile | None) -> None:
        if spare is not None:
            spare.path = path
            spare.close()  # its mapping first
        else:
            unlink_quietly(path)

    def close(self) -> None:
        """Delete every spare (before the last rank removes the directory), and unmap."""
        with self._lock:
            spares, self._free = self._free, []
        for spare in spares:
            spare.close()
        self.mapped.close()
