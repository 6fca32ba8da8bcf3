"""A sender's ring file per receiver: mid-size point-to-point messages without a file each.

Why: a message file costs its sender an open, a write, a rename and a close, and its receiver
an open, a read, a rename (to keep it as a spare) and a close; a 64 KiB ping-pong spent more
there than in its copies (2 ranks, sendrecv 64 KiB: 232 µs against Gloo's 150). On a local
filesystem a message between INLINE_MAX and RING_MESSAGE_MAX bytes instead goes into the
sender's ring file for that receiver (``ring<src>-<dst>``, RING_BYTES, kept open by both) with
one ``pwritev``; the record slot that would hold a small message holds where it lies, written
with the pair's counters in the one locked write as before. The receiver reads it with
``preadv`` straight into the tensor.

Collectives use the same ring, one per rank (``ring<rank>``, outbox.py): a message of up to
COLLECTIVE_RING_MAX that does not fit a slot, its reference in the slot with the step, its space
reused once every reader is past it (the slot's rule); numbered in publishing order, which is
the order the outbox frees them in.

Space is reused once the receiver's ``received`` counter passes the message's index. The
counter counts, it does not say which: a receiver that leaves a message for later (another tag
came first) copies it out first (``Incoming.keep``). Network filesystems never use rings:
another client may cache old pages of the file (the same rule as spares, outbox.py).
"""

from __future__ import annotations

import errno
import os
from collections import deque
from collections.abc import Sequence

from ..defaults import RING_BYTES
from ..files.io import open_file, retrying, write_all

__all__ = ["SendRing"]

_ALIGN = 64
_MAX_BUFFERS = 512  # one pwritev (IOV_MAX is 1024): a message of more tensors goes as a file


class SendRing:
    """Where this rank's messages to one peer lie in its ring file, until that peer received them."""

    def __init__(self, path: str, capacity: int = RING_BYTES) -> None:
        self.path = path
        self.capacity = capacity
        self._fd = -1
        self._head = 0  # bytes ever allocated, counting skipped ends of laps
        self._live: deque[tuple[int, int]] = deque()  # (message index, where its bytes start)
        self.broken = False  # a write failed (full filesystem): files from now on

    def place(self, index: int, buffers: Sequence[memoryview | bytes], size: int, received: int) -> int | None:
        """Write message ``index`` into the ring and return its offset, or None where it does
        not fit beside the messages the peer has not received yet (``received``: its counter)."""
        if self.broken or len(buffers) > _MAX_BUFFERS:
            return None
        size = (size + _ALIGN - 1) // _ALIGN * _ALIGN
        while self._live and self._live[0][0] < received:
            self._live.popleft()
        tail = self._live[0][1] if self._live else self._head
        start = self._head
        if start % self.capacity + size > self.capacity:  # never wraps: it starts the next lap
            start += self.capacity - start % self.capacity
        if start + size - tail > self.capacity:
            return None
        offset = start % self.capacity
        try:
            if self._fd < 0:
                # this rank's own, made here: a file already in its place is not adopted
                self._fd = open_file(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
                retrying(lambda: os.ftruncate(self._fd, self.capacity))  # sparse: pages come as written
            write_all(self._fd, buffers, offset)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.ENOMEM):
                raise
            self.broken = True  # /dev/shm full: the message goes as a file, which says so if it fails too
            return None
        self._head = start + size
        self._live.append((index, start))
        return offset

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
