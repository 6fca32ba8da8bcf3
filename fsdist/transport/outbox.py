"""This rank's outgoing messages: where each goes, and how long it is kept there.

Where (``place``, one policy for collective and point-to-point messages: group.py, pairs.py):
a message whose encoding fits a slot (state_record.INLINE_MAX) travels inside the record write
that announces it: no file to create, rename, open or unlink. A mid-size one (local
filesystems: a ring where spares are used) is one ``pwritev`` into a ring file both sides keep
open, where the slot holds where it lies. Anything else, or where no slot or no ring room is
free, is a file. The callers differ only in where their slots and rings are and how they free
them, which they pass in; what they get back is a tagged ``Placement`` they record and later
dispose of.

How long (``Outbox``, a collective's messages): a rank deletes (or keeps as a spare,
spares.py) its own message of an operation once every peer's record shows it past that
operation: nobody has the file open or will look its name up again. It checks every GC_EVERY
operations, as soon as its uncollected messages exceed GC_BYTES, and whenever its oldest
message would become a spare. A rank that publishes ahead of its readers (a broadcast root)
waits before a file that would pass GC_BYTES or find no spare free until readers are done with
earlier ones (``make_room``), and never runs more than RUN_AHEAD operations ahead of its
slowest peer, so the directory holds a bounded number of files.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..defaults import (
    COLLECTIVE_RING_MAX,
    GC_BYTES,
    GC_EVERY,
    INLINE,
    MAP_MIN_BYTES,
    REUSE_FILES,
    REUSE_MIN_BYTES,
    RUN_AHEAD,
)
from ..files.io import publish, write_new
from ..files.mapped import MappedFiles
from ..files.seal import Seal
from ..protocol import layout, message
from ..protocol.state_record import INLINE_MAX, INLINE_SLOTS
from .progress import Progress
from .rings import SendRing
from .spares import SpareFile, SparePool, torch_copy

__all__ = ["InFile", "InSlot", "Outbox", "Placement", "place"]

Buffers = Sequence[memoryview | bytes]


@dataclass(frozen=True)
class InSlot:
    """In a record slot: the message itself, or (``ring_index`` set) where it lies in the ring file."""

    slot: int
    data: bytes
    ring_index: int | None = None


@dataclass(frozen=True)
class InFile:
    """A file of its own (written through ``spare`` where one was reused: spares.py)."""

    path: str
    size: int
    spare: SpareFile | None


Placement = InSlot | InFile


def place(
    seq: int, tag: int, description: str, tensors: Sequence[torch.Tensor], check: Seal, *,
    free_slot: Callable[[], int | None], ring: Callable[[Buffers, int], tuple[int, int] | None] | None,
    ring_max: int, write: Callable[[Buffers, int], tuple[str, SpareFile | None]],
) -> Placement:  # fmt: skip
    """Encode the message (``check``: the seal of its identity) and put it where it goes.

    ``free_slot``: a slot no reader may still read, or None; ``ring``: writes the encoded
    message into the ring file and returns (offset, its number in the ring), or None where
    there is no room (None: no ring here); ``ring_max``: the largest message it takes;
    ``write``: publishes a file, returns its path and the spare it went through.
    """
    encoded = message.encode_inline(seq, tag, description, tensors, INLINE_MAX, check) if INLINE else None
    if encoded is not None:
        slot = free_slot()
        if slot is not None:
            return InSlot(slot, encoded)
    buffers = message.encode(seq, tag, description, tensors, check)
    size = sum(len(b) for b in buffers)
    if INLINE and encoded is None and ring is not None and size <= ring_max:
        slot = free_slot()
        placed = ring(buffers, size) if slot is not None else None
        if slot is not None and placed is not None:
            offset, index = placed
            return InSlot(slot, message.encode_ring_ref(offset, size), index)
    path, spare = write(buffers, size)
    return InFile(path, size, spare)


class Outbox:
    """This rank's published messages of one group, until every peer is past them."""

    def __init__(self, progress: Progress, reuse_files: bool) -> None:
        """``reuse_files``: retired files are kept as spares and mid-size messages go through a
        ring file (Locality.reuse_files)."""
        self._progress = progress
        self.directory = progress.directory
        self._published: deque[_Published] = deque()
        #: which inline slots of this rank's record hold a message peers may still read
        self._slot_in_use = [False] * INLINE_SLOTS
        self._bytes = 0
        #: every rank's spares may come back to this one, its own as its peers' next messages
        mapped = MappedFiles(MAP_MIN_BYTES, capacity=REUSE_FILES * (progress.size + 1), copy=torch_copy)
        self.spares = SparePool(self.directory, progress.rank, reuse_files, REUSE_FILES, REUSE_MIN_BYTES, mapped)
        #: mid-size messages' ring file, where retired files are reused (the same rule, for the
        #: same reason: another client may cache a rewritten file's old pages)
        self._ring = (
            SendRing(os.path.join(self.directory, layout.collective_ring_name(progress.rank)))
            if self.spares.enabled
            else None
        )
        self._ring_next = 0  # the number of the next message placed in the ring

    def publish(
        self, step: int, tag: int, tensors: Sequence[torch.Tensor], check: Seal, readers: Sequence[int] | None
    ) -> Placement:
        """Place this rank's message for (current operation, ``step``) and keep its space until
        ``readers`` (None: every peer) are past it. ``check``: the seal of its identity."""
        progress = self._progress
        seq = progress.seq

        def write(buffers: Buffers, size: int) -> tuple[str, SpareFile | None]:
            self.make_room(size)
            return self.write(layout.message_name(progress.rank, seq, step), buffers, size)

        ring = self.place_in_ring if self._ring is not None else None
        where = place(
            seq, tag, progress.description, tensors, check,
            free_slot=self.free_slot, ring=ring, ring_max=COLLECTIVE_RING_MAX, write=write,
        )  # fmt: skip
        self.keep(seq, step, readers, where)
        return where

    def make_room(self, size: int) -> None:
        """Before publishing a collective's file of ``size`` bytes: wait while this rank's messages
        of earlier operations fill the bounds, until their readers are done with enough of them.

        The bounds: GC_BYTES of uncollected files, and, where retired files are reused, every
        spare in flight (a fresh file on tmpfs costs ~3× a spare's rewrite, and its pages). A
        rank publishing ahead of its readers (a broadcast root) stays a few messages ahead, as
        a socket's buffer holds a sender back, instead of RUN_AHEAD operations of files.
        Only earlier operations' messages count: their readers need nothing more from this
        rank to finish them, so the wait cannot deadlock.
        """
        if self._over_bounds(size):
            self.collect()
            if self._over_bounds(size):
                self._wait_for_readers(size)

    def _over_bounds(self, size: int) -> bool:
        """Whether this rank's files of earlier operations fill the bounds (``make_room``). Two of
        them are always allowed: one written while the other is read (16 MiB broadcast: 4.0 ms
        per op when the root waited for each file to be read first, 2.6 ms with two)."""
        if not self._published or self._published[0].seq >= self._progress.seq:
            return False
        earlier = [p.where for p in self._published if isinstance(p.where, InFile) and p.seq < self._progress.seq]
        if len(earlier) < 2:
            return False
        if sum(f.size for f in earlier) + size > GC_BYTES:
            return True
        if not self.spares.enabled or size < REUSE_MIN_BYTES or self.spares.free():
            return False
        return sum(1 for f in earlier if f.size >= REUSE_MIN_BYTES) >= REUSE_FILES

    def _wait_for_readers(self, size: int) -> None:
        progress = self._progress
        progress.flush()  # about to wait: peers must see where this rank is

        def room() -> bool | None:
            self.collect()
            return None if self._over_bounds(size) else True

        def timed_out() -> BaseException:
            oldest = self._published[0]
            reader = next(r for r in oldest.readers_among(progress.others) if not oldest.done_for(progress, r))
            return progress.timed_out(reader, f"a position past operation #{oldest.seq} (this rank's message unread)")

        # a reader that moves on while this rank waits in a later operation wakes it
        progress.waiter.for_any(room, progress.deadline(), timed_out, lambda _: progress.check_health(None))

    def write(self, name: str, buffers: Sequence[memoryview | bytes], size: int) -> tuple[str, SpareFile | None]:
        """Publish ``name`` through a spare where one is kept, else as a fresh file: renamed into
        place where files are reused (local filesystems), written in place where they are not
        (network filesystems: files/io.write_new says why). Its readers open it only after the
        record that names it, which the caller writes once this returns."""
        path = os.path.join(self.directory, name)
        if not self.spares.enabled:
            return write_new(path, buffers), None
        spare = self.spares.take(size)
        if spare is None:
            return publish(self.directory, name, buffers), None
        spare.publish(path, buffers)
        return path, spare

    def keep(self, seq: int, step: int, readers: Sequence[int] | None, where: Placement) -> None:
        """Hold a published collective message's space (its slot, its ring space, its file) until
        its readers are past it (``_Published``)."""
        if isinstance(where, InSlot):
            self._slot_in_use[where.slot] = True
        else:
            self._bytes += where.size
        self._published.append(_Published(seq, step, readers, where))

    def free_slot(self) -> int | None:
        """An inline slot no peer may still read (collecting first if none is), or None."""
        if all(self._slot_in_use):
            self.collect()
        return next((slot for slot, used in enumerate(self._slot_in_use) if not used), None)

    def place_in_ring(self, buffers: Sequence[memoryview | bytes], size: int) -> tuple[int, int] | None:
        """Write a mid-size message into this rank's ring file: (its offset, its number), or
        None (no room beside the messages readers may still read).

        One ``pwritev`` into a file kept open, where a file of its own costs a create or a
        spare's rename, and its readers an open, a close and its collection a rename.
        """
        assert self._ring is not None
        offset = self._ring.place(self._ring_next, buffers, size, self._oldest_in_ring())
        if offset is None:
            self.collect()
            offset = self._ring.place(self._ring_next, buffers, size, self._oldest_in_ring())
            if offset is None:
                return None
        self._ring_next += 1
        return offset, self._ring_next - 1

    def _oldest_in_ring(self) -> int:
        """The number of the oldest ring message readers may still read (every one before it is free)."""
        ringed = (p.where.ring_index for p in self._published if isinstance(p.where, InSlot))
        return next((index for index in ringed if index is not None), self._ring_next)

    def collect_if_due(self, entered: int) -> None:
        """Collect every GC_EVERY operations (``entered``: how many this group's transport has
        seen), past GC_BYTES, or when a spare is in reach."""
        if entered % GC_EVERY == 0 or self._bytes > GC_BYTES or self._spare_in_reach():
            self.collect()  # also compares peers' history hashes with this rank's

    def hold_back_if_ahead(self, seq: int) -> None:
        """Wait while this rank is more than RUN_AHEAD operations ahead of its slowest peer."""
        if self._published and seq - self._published[0].seq > RUN_AHEAD:
            self._wait_for_stragglers()

    def collect(self) -> None:
        """Dispose of own messages that their readers are done with (in publishing order).

        A message for any peer is done once every peer is in a later operation; one for named
        readers once each of them has reached a later step (it reads before it moves on). Only
        the readers of the oldest message whose positions are not known to be past it are read.
        """
        if not self._published:
            return
        progress = self._progress
        oldest = self._published[0]
        for peer in oldest.readers_among(progress.others):
            if not oldest.done_for(progress, peer):
                progress.peer_state(peer)
        while self._published and self._published[0].done(progress):
            where = self._published.popleft().where
            if isinstance(where, InSlot):
                self._slot_in_use[where.slot] = False
            else:
                self._bytes -= where.size
                self.spares.give_back(where.path, where.size, where.spare)

    def close(self) -> None:
        """Unmap every spare (the files themselves go with the group's directory)."""
        for published in self._published:
            if isinstance(published.where, InFile) and published.where.spare is not None:
                published.where.spare.close(remove=False)
        self.spares.close()
        if self._ring is not None:
            self._ring.close()

    def _spare_in_reach(self) -> bool:
        """Whether the oldest uncollected message would become a spare: collect it now, not later."""
        oldest = self._published[0].where if self._published else None
        return isinstance(oldest, InFile) and self.spares.wants(oldest.size)

    def _wait_for_stragglers(self) -> None:
        """Block until the slowest peer is within RUN_AHEAD / 2 operations of this rank."""
        progress = self._progress
        progress.flush()  # about to wait: peers must see where this rank is

        def caught_up() -> bool | None:
            self.collect()
            return True if not self._published or progress.seq - self._published[0].seq <= RUN_AHEAD // 2 else None

        def timed_out() -> BaseException:
            slowest = min(progress.others, key=lambda r: progress.peer_seq[r])
            return progress.timed_out(slowest, f"operation #{progress.seq - RUN_AHEAD // 2}")

        # every peer's health, not just the one that looked slowest: cached positions go stale
        progress.waiter.for_any(caught_up, progress.deadline(), timed_out, lambda _: progress.check_health(None))


@dataclass
class _Published:
    """One own message of a collective, kept until its readers are done with it."""

    seq: int
    step: int
    readers: Sequence[int] | None  # None: any peer may read it
    where: Placement

    def readers_among(self, others: Sequence[int]) -> Sequence[int]:
        return others if self.readers is None else self.readers

    def done(self, progress: Progress) -> bool:
        """Whether every reader is done with it (so its space may be reused)."""
        return all(self.done_for(progress, peer) for peer in self.readers_among(progress.others))

    def done_for(self, progress: Progress, peer: int) -> bool:
        if self.readers is None:
            return progress.peer_seq[peer] > self.seq
        return progress.peer_position[peer] > (self.seq, self.step)
