"""Spare message files: retired files a rank keeps, mapped, and rewrites in place.

Why: on tmpfs, filling a fresh file runs at ~2.3 GB/s here (the kernel zeroes every new page,
then copies into it), rewriting an allocated file through ``write`` at ~4–5 GB/s, and copying
into a mapping that stays in place at memcpy speed. Unlinking a large file costs its pages'
release too. So on local filesystems a rank keeps a few retired message files as *spares*:
each is mapped once, and a message published through it is a memcpy into the mapping
followed by the same ``rename`` into place as a fresh file, so readers see the same
all-or-nothing publication.

A file becomes a spare only when nobody can read it any more: a collective's message once
every peer has moved past its operation, a point-to-point message once its receiver consumed
it (the receiver keeps it: in a ring or a ping-pong it is the receiver that sends next). It is
renamed to a hidden name first, so no name a reader looks up leads to it.

Network filesystems never use spares (see ``transport._reuse_files``): another client may
still cache the old pages of a rewritten inode.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Sequence

import torch

from ..errors import FsdistError
from ..files.io import open_file, retrying, unlink_quietly
from ..protocol import layout

__all__ = ["SpareFile", "SparePool"]

_TORCH_COPY_MIN = 64 << 10


class SpareFile:
    """One spare: its current name, its size, and (once written) a mapping of all of it."""

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._bytes: torch.Tensor | None = None  # the mapping as a uint8 tensor

    def publish(self, final: str, buffers: Sequence[memoryview | bytes]) -> None:
        """Copy ``buffers`` into the file from its start, then rename it to ``final``.

        A file too small grows with ``posix_fallocate`` before it is mapped: a store into a
        hole of a mapped file that finds the disk full kills the process with SIGBUS, while
        ``fallocate`` fails with ENOSPC. Bytes past the message stay as they were: the
        message header says where every part lies, so a reader never reads them.
        """
        total = sum(len(b) for b in buffers)
        try:
            if self._map is None or len(self._map) < total:
                self._remap(total)
            assert self._map is not None and self._bytes is not None
            position = 0
            for buffer in buffers:
                view = memoryview(buffer).cast("B")
                if len(view) >= _TORCH_COPY_MIN and not view.readonly:
                    # torch's copy lets go of the GIL (a slice assignment would hold it for the
                    # whole memcpy, stalling this process's receive thread meanwhile)
                    self._bytes[position : position + len(view)].copy_(torch.frombuffer(view, dtype=torch.uint8))
                else:
                    self._map[position : position + len(view)] = view
                position += len(view)
            retrying(lambda: os.rename(self.path, final))
        except OSError as exc:
            self.close()  # a spare that failed once (disk full, ...) is not kept
            raise FsdistError(f"could not publish {final}: {os.strerror(exc.errno or 0)} ({exc})") from exc
        self.path = final

    def _remap(self, needed: int) -> None:
        self._unmap()
        if self._fd < 0:
            self._fd = open_file(self.path, os.O_RDWR)
        have = os.fstat(self._fd).st_size
        self.size = max(self.size, needed, have)
        try:
            os.posix_fallocate(self._fd, 0, self.size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
                raise
            _extend_with_zeros(self._fd, have, self.size)  # allocates too, failing cleanly
        self._map = mmap.mmap(self._fd, self.size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)

    def _unmap(self) -> None:
        self._bytes = None  # first: the tensor must never outlive the mapping it points into
        if self._map is not None:
            self._map.close()
            self._map = None

    def close(self, remove: bool = True) -> None:
        self._unmap()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if remove:
            unlink_quietly(self.path)


def _extend_with_zeros(fd: int, start: int, end: int) -> None:
    zeros = bytes(1 << 20)
    while start < end:
        start += os.pwrite(fd, zeros[: min(len(zeros), end - start)], start)


class SparePool:
    """At most ``max_files`` spares of one rank in one group directory (thread-safe).

    Collectives (the group's worker thread), sends (callers' threads) and receives (the
    receive thread) all take and give back spares.
    """

    def __init__(self, directory: str, rank: int, enabled: bool, max_files: int, min_bytes: int) -> None:
        self.enabled = enabled
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
            if spare is not None:
                spare.close(remove=False)
            unlink_quietly(path)
            return
        with self._lock:
            hidden = os.path.join(self._directory, layout.spare_name(self._rank, self._named))
            self._named += 1
        try:
            os.rename(path, hidden)
        except OSError:
            if spare is not None:
                spare.close(remove=False)
            unlink_quietly(path)
            return
        if spare is None:
            spare = SpareFile(hidden, size)
        spare.path = hidden
        with self._lock:
            if len(self._free) < self._max_files:
                self._free.append(spare)
                return
        spare.close()

    def close(self) -> None:
        """Delete every spare (before the last rank removes the directory)."""
        with self._lock:
            spares, self._free = self._free, []
        for spare in spares:
            spare.close()
