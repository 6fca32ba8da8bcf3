"""Mappings of message files kept by inode, so a file that comes back is copied, not mapped again.

Why: on a local filesystem a rank's spares (transport/spares.py) are the same few inodes over and
over, under new names: a collective's reader opens its peer's next message and finds an inode it
read before, and a point-to-point file goes back and forth between two ranks (each keeps the
other's message as its next spare). Measured on tmpfs here, 64 MiB: ``pread`` 8.5–11 ms,
``pwrite`` 9.5 ms, mapping a file (MAP_POPULATE), copying and unmapping 11–12 ms, a copy through
a mapping that stays 3 ms. A 2-rank 64 MiB send/recv ring paid a map and an unmap per message
on each side.

A mapping is MAP_SHARED: every process of the machine sees the same page cache, so what the
writer publishes (and renames into place, and announces in its record) is what a later copy
out of the mapping reads. Local filesystems only: another NFS client may cache a rewritten
file's old pages (the spares' rule). A file is mapped the second time its inode is seen
(a fresh file read once and deleted is never mapped), and at most ``capacity`` inodes stay
mapped; one found deleted (no link left) is let go at the next miss, so a mapping never pins
the memory of a file nobody can reach for longer than that. Spares only grow, and a copy is
checked against the size the mapping was made for, so a file shorter than a message says is
read with ``pread`` and fails there as it always did. A reduction reads its operand straight
out of a kept mapping (``hold``), which stays mapped until the operand is released.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["Copy", "Held", "MappedFiles", "copy_bytes"]

#: copies ``source`` into ``dest`` (same length); the transport passes torch's, which lets go of
#: the GIL and uses the intra-op threads (this layer stays torch-free for the diagnostics)
Copy = Callable[[memoryview, memoryview], None]


def copy_bytes(dest: memoryview, source: memoryview) -> None:
    dest[:] = source


#: how many inodes seen once are remembered (to map them when they come back)
_SEEN = 64


@dataclass(eq=False)
class _Mapping:
    fd: int  # a descriptor of its own: the link count is asked of it
    map: mmap.mmap
    writable: bool
    users: int = field(default=0)  # copies in progress: never unmapped under them


class MappedFiles:
    """One rank's mappings of message files of one group, by inode (thread-safe)."""

    def __init__(self, min_bytes: int, capacity: int = 16, copy: Copy = copy_bytes) -> None:
        self._min_bytes = min_bytes
        self._copy = copy
        self._capacity = capacity
        self._maps: OrderedDict[tuple[int, int], _Mapping] = OrderedDict()
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def read(self, fd: int, offset: int, dest: memoryview) -> bool:
        """Copy ``len(dest)`` bytes at ``offset`` of ``fd``'s file into ``dest`` through a kept
        mapping; False where this does not serve (small, first sight, short file): ``pread``."""
        if len(dest) < self._min_bytes:
            return False
        found = self._use(fd, offset + len(dest), writable=False, first_sight_maps=False)
        if found is None:
            return False
        try:
            with memoryview(found.map) as whole:  # (an export: the map cannot close under it)
                self._copy(dest.cast("B"), whole[offset : offset + len(dest)])
        finally:
            self._done(found)
        return True

    def hold(self, fd: int, offset: int, nbytes: int) -> Held | None:
        """``nbytes`` at ``offset`` of ``fd``'s file as a view of its kept mapping, to be read
        only, held (never unmapped) until released; None where ``read`` would not serve: the
        caller maps the file itself. Taken at once, so ``fd`` may be closed before the view is used.

        Why: a reduction's operand read straight from the peer's file; a fresh mapping of 16 MiB
        costs 256 page faults (~1 ms of system time here) on every operation, a kept one none.
        """
        found = None if nbytes < self._min_bytes else self._use(fd, offset + nbytes, False, False)
        return None if found is None else Held(self, found, offset, nbytes)

    def write(self, fd: int, buffers: Sequence[memoryview | bytes]) -> bool:
        """Copy ``buffers`` one after the other into ``fd``'s file from its start (opened for
        writing, at least as long as they are), through its kept mapping or a new one; False
        where that mapping is too short and in use by another copy (then: ``pwritev``)."""
        total = sum(len(b) for b in buffers)
        found = self._use(fd, total, writable=True, first_sight_maps=True)
        if found is None:
            return False
        try:
            position = 0
            with memoryview(found.map) as whole:
                for buffer in buffers:
                    view = memoryview(buffer).cast("B")
                    self._copy(whole[position : position + len(view)], view)
                    position += len(view)
        finally:
            self._done(found)
        return True

    def forget(self, fd: int) -> None:
        """Let go of ``fd``'s file's mapping (the file is about to be deleted)."""
        key = _key(os.fstat(fd))
        with self._lock:
            mapping = self._maps.get(key)
            if mapping is not None and mapping.users == 0:
                self._unmap(key)

    def close(self) -> None:
        """Unmap everything (the group is closing); a mapping still in use by a copy or a hold
        (another thread, past a join's timeout) is unmapped when that use ends."""
        with self._lock:
            self._closed = True
            for key, mapping in list(self._maps.items()):
                if mapping.users == 0:
                    self._unmap(key)
            self._seen.clear()

    def _use(self, fd: int, end: int, writable: bool, first_sight_maps: bool) -> _Mapping | None:
        """The mapping of ``fd``'s file covering ``[0, end)``, held for a copy, or None."""
        stat = os.fstat(fd)
        key = _key(stat)
        with self._lock:
            mapping = self._maps.get(key)
            if mapping is not None and len(mapping.map) >= end and (mapping.writable or not writable):
                self._maps.move_to_end(key)
                mapping.users += 1
                return mapping
            self._drop_unreachable()
            mapping = self._maps.get(key)  # (gone if its file was deleted)
            if stat.st_size < end:
                return None
            if not first_sight_maps and mapping is None and key not in self._seen:
                self._seen[key] = None
                if len(self._seen) > _SEEN:
                    self._seen.popitem(last=False)
                return None
            if mapping is not None and mapping.users == 0:
                self._unmap(key)  # too short, or read-only where a write needs it: made again
            elif mapping is not None:
                return None  # in use by another copy: this one reads or writes without it
            self._seen.pop(key, None)
            mapping = self._map(fd, key, stat.st_size, writable)
            mapping.users += 1
            return mapping

    def _map(self, fd: int, key: tuple[int, int], size: int, writable: bool) -> _Mapping:
        own = os.dup(fd)
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mapped = mmap.mmap(own, size, flags=flags, prot=prot)
        except BaseException:
            os.close(own)
            raise
        self._maps[key] = mapping = _Mapping(own, mapped, writable)
        while len(self._maps) > self._capacity:
            oldest = next((k for k, m in self._maps.items() if m.users == 0 and k != key), None)
            if oldest is None:
                break
            self._unmap(oldest)
        return mapping

    def _drop_unreachable(self) -> None:
        """Unmap files deleted since they were mapped (their memory is freed only then)."""
        for key, mapping in list(self._maps.items()):
            if mapping.users == 0 and os.fstat(mapping.fd).st_nlink == 0:
                self._unmap(key)

    def _unmap(self, key: tuple[int, int]) -> None:
        mapping = self._maps.pop(key)
        mapping.map.close()
        os.close(mapping.fd)

    def _done(self, mapping: _Mapping) -> None:
        with self._lock:
            mapping.users -= 1
            if self._closed and mapping.users == 0:
                key = next((k for k, m in self._maps.items() if m is mapping), None)
                if key is not None:
                    self._unmap(key)


class Held:
    """A view into a kept mapping, which stays mapped until ``release`` (or the end of the
    ``with`` block); whatever was made from ``view`` must not be used after that, and must
    never be written: the mapping is the file itself (read-only where this rank only ever
    read the file, and a store into it kills the process; writable where it wrote it)."""

    def __init__(self, files: MappedFiles, mapping: _Mapping, offset: int, nbytes: int) -> None:
        self._files: MappedFiles | None = files
        self._mapping = mapping
        self._whole = memoryview(mapping.map)  # (an export: the map cannot close under it)
        self.view = self._whole[offset : offset + nbytes]

    def release(self) -> None:
        if self._files is not None:
            self.view.release()
            self._whole.release()
            self._files._done(self._mapping)
            self._files = None

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _key(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino
