"""Point-to-point messages between pairs of ranks: numbered per pair, counted in the records.

Sends are buffered. Each rank's state record has a pair area per peer (state_record.py): the
count of messages sent to that peer, the count of its messages consumed, and four inline slots.
A small message goes into the slot of its index, written with both counters in one locked
write; a larger one (or one whose slot still holds an unconsumed message) is published as
``p<src>-<dst>.<index>`` first, then the counter is raised. The receiver reads the sender's
pair area for it in one locked read (how many were sent, the inline ones, and how many of its
own messages the sender has consumed), consumes the messages (p2p.Mailbox matches them to
receives) and raises its ``received`` counter. A sender with MAX_UNRECEIVED_SENDS messages
unreceived by one rank waits until that rank catches up. A consumed file becomes the
receiver's spare, or goes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence

import torch

from ..defaults import INLINE, MAX_UNRECEIVED_SENDS, RING_MESSAGE_MAX
from ..errors import ProtocolError
from ..files.doorbell import Doorbell
from ..files.locks import TornReads
from ..files.seal import Seal
from ..files.waiting import Waiter
from ..protocol import layout, state_record
from .incoming import PeerRings, open_incoming
from .interfaces import Incoming
from .locality import Locality
from .outbox import InSlot, Outbox, place
from .progress import Progress
from .rings import SendRing

__all__ = ["RIDE_AREAS", "Pairs"]

#: A send carries the counts held back for peers whose pair areas lie near its receiver's, in
#: one write spanning fewer than this many areas (at most 2 whole areas and a count, ~16 KiB;
#: the areas between rewritten as they are) instead of a locked write of its own for each
#: count (a ring of 3 or 4: every rank's previous rank lies within 2 areas of its next one).
RIDE_AREAS = 3


class Pairs:
    """This rank's sending and receiving counters, and its point-to-point messages: the group's
    PointToPointChannel (interfaces.py)."""

    def __init__(self, progress: Progress, outbox: Outbox, locality: Locality) -> None:
        self._progress = progress
        self._outbox = outbox
        self.directory = progress.directory
        self.rank = progress.rank
        self.size = size = progress.size
        self._sent = [0] * size
        #: how many of this rank's messages each peer had consumed when last read (its pair
        #: area is read on every receive from it; the slots' and the cap's checks read it anew
        #: only when this says a slot is taken or the cap reached)
        self._received_by = [0] * size
        self._send_lock = threading.Lock()  # threads sending at once must not take the same index
        #: this rank's pair areas as last written: a send and an acknowledgement (from the
        #: receiving thread) both write the counters, so they write from one image, in turn
        self._areas = [bytearray(state_record.PAIR_AREA) for _ in range(size)]
        self._area_lock = threading.Lock()
        self._own_seal = progress.seals[progress.rank]  # (the counters' tags: this rank's record's)
        #: acknowledgements not written yet (peer -> received count; see ``acknowledge``), read
        #: by a collective's enter to call ``flush_acknowledgements`` only when there are some
        self.ack_due: dict[int, int] = {}
        #: each peer's pair area for this rank, as read by the last ``sent_to_me``
        self._seen: list[bytes] = [b""] * size
        self._seen_unlocked = [False] * size  # (read without the lock: see ``sent_to_me``)
        self._inline_open: set[tuple[int, int]] = set()
        # receives are matched on their own thread: a bell of their own, so neither waiter
        # swallows the other's wake-up
        self._bell = Doorbell([layout.p2p_doorbell_file(self.directory, r) for r in range(size)], progress.rank)
        self._waiter = Waiter(self._bell, size, looks_cost=locality.lockless)
        #: mid-size messages go through ring files where files are reused (local filesystems)
        self._rings_enabled = INLINE and locality.reuse_files
        self._mapped = outbox.spares.mapped if locality.maps_messages else None
        self._send_rings: dict[int, SendRing] = {}
        self._read_rings = PeerRings()

    def send(self, dst: int, tensors: Sequence[torch.Tensor], tag: int, description: str) -> int:
        """Publish a message to ``dst`` (buffered: never waits for the receiver). Returns its index.

        In the slot of its index in the pair area for ``dst`` (itself, or where it lies in the
        ring file for ``dst``), written with the counters in one locked write, or as a file
        followed by the counters (outbox.py)."""
        with self._send_lock:
            if self._sent[dst] - self._received_by[dst] >= MAX_UNRECEIVED_SENDS:
                self._wait_for_receiver(dst)
            index = self._sent[dst]
            name = layout.p2p_name(self._progress.rank, dst, index)
            where = place(
                index, tag, description, tensors, self._seal(self._progress.rank, dst, index),
                free_slot=lambda: index % state_record.P2P_SLOTS if self._slot_free(dst, index) else None,
                ring=(lambda buffers, size: self._place_in_ring(dst, index, buffers, size)) if self._rings_enabled
                else None,
                ring_max=RING_MESSAGE_MAX, write=lambda buffers, size: self._outbox.write(name, buffers, size),
            )  # fmt: skip
            if isinstance(where, InSlot):
                self._put_in_slot(dst, index, where.data)
            else:
                if where.spare is not None:
                    where.spare.close(remove=False)  # the receiver owns the file now; this rank forgets it
                with self._area_lock:
                    self._write_area(dst, self._set_counters(dst, index + 1, self._received_to_write(dst)))
            self._sent[dst] = index + 1
            self._bell.wake([dst])
        return index

    def _slot_free(self, dst: int, index: int) -> bool:
        """Whether message ``index``'s slot may be written: ``dst`` counted the slot's previous
        message received (read anew only when the last count read says it has not)."""
        if index - self._received_by[dst] < state_record.P2P_SLOTS:
            return True
        return index - self._read_received_by(dst) < state_record.P2P_SLOTS

    def _put_in_slot(self, dst: int, index: int, encoded: bytes) -> None:
        """Write ``encoded`` (a message, or where it lies in the ring) into its slot, with the counters."""
        with self._area_lock:
            received = self._received_to_write(dst)
            self._write_area(
                dst, state_record.put_p2p(self._areas[dst], index + 1, received, index, encoded, dst, self._own_seal)
            )

    def _write_area(self, dst: int, end: int) -> None:
        """Write ``dst``'s area image through ``end``, and in the same write the counts held back
        for peers whose areas lie near it, the write spanning fewer than RIDE_AREAS areas (the
        area lock is held).

        One write from the first area to the last: the areas between are rewritten as this
        rank last wrote them (it is their only writer), so what changes is only the counters."""
        first = last = dst
        riding = []
        for src in sorted(self.ack_due, key=lambda peer: abs(peer - dst)):  # nearest first
            if max(last, src) - min(first, src) < RIDE_AREAS:
                riding.append(src)
                first, last = min(first, src), max(last, src)
        if not riding:
            self._progress.write_own(bytes(self._areas[dst][:end]), state_record.pair_offset(dst))
            return
        for src in riding:
            self._set_counters(src, self._counters_written(src)[0], self.ack_due.pop(src))
        image = b"".join(self._areas[peer] for peer in range(first, last))
        image += self._areas[last][: end if last == dst else state_record.PAIR_COUNTERS_SIZE]
        self._progress.write_own(image, state_record.pair_offset(first))

    def _place_in_ring(
        self, dst: int, index: int, buffers: Sequence[memoryview | bytes], size: int
    ) -> tuple[int, int] | None:
        """Write message ``index`` into the ring for ``dst`` (local filesystems): (its offset, its
        number), or None where there is no room beside the messages ``dst`` has not received."""
        ring = self._send_rings.get(dst)
        if ring is None:
            path = os.path.join(self.directory, layout.ring_name(self._progress.rank, dst))
            ring = self._send_rings[dst] = SendRing(path)
        offset = ring.place(index, buffers, size, self._received_by[dst])
        if offset is None:
            offset = ring.place(index, buffers, size, self._read_received_by(dst))
        return None if offset is None else (offset, index)

    def sent_to_me(self, src: int) -> int:
        """How many messages ``src`` has sent to this rank (reading its whole pair area for us).

        Optimistic groups read it without the lock first (Progress.read_peer): counters torn by
        the sender's write fail their CRC, and ``_find`` reads the area again under the lock when
        a slot is torn or older than the counters."""
        return self._take_area(src, locked=False)

    def _take_area(self, src: int, locked: bool) -> int:
        offset, where = state_record.pair_offset(self._progress.rank), self._progress.state_path(src)
        raw, (sent, received), unlocked = self._progress.read_peer(
            src,
            offset,
            state_record.PAIR_AREA,
            lambda raw: state_record.decode_pair(raw, self._progress.rank, self._progress.seals[src], where),
            locked=locked,
        )
        self._seen[src] = raw
        self._seen_unlocked[src] = unlocked
        self._received_by[src] = max(self._received_by[src], received)
        return sent

    def _find(self, src: int, index: int) -> bytes | None:
        """Message ``index``'s slot content from ``src``'s area as last read (None: a file)."""
        try:
            inline = state_record.find_p2p(self._seen[src], index)
        except ProtocolError:
            if not self._seen_unlocked[src]:
                raise
            inline = None  # a slot torn by a write
        if inline is None and self._seen_unlocked[src]:
            # torn, or counters newer than the slot beside them, or really a file: the lock says
            self._take_area(src, locked=True)
            inline = state_record.find_p2p(self._seen[src], index)
        return inline

    def acknowledge(self, src: int, received: int) -> None:
        """Count ``src``'s messages consumed. Where this rank sends to ``src``, or to a peer
        whose pair area lies within RIDE_AREAS of its, the count is written with the next such
        send, or on its own when a second one is due, before this rank waits, or enters a
        collective; otherwise at once.

        Why late: in a ping-pong or a ring of two the reply is the next write of the same pair
        area, and carries the count with it (2-rank 8-byte send/recv ring: one locked write per
        iteration instead of two); in a ring of 3 or 4 the send to the next rank carries the
        count for the previous one in the same write (``_write_area``). A sender needs the count
        only to reuse a slot or ring space (without it: a file) and, blocking, past
        MAX_UNRECEIVED_SENDS; held back by at most one message, written before this rank waits
        in fsdist and by the receive loop's thread within a tick whatever it does (even
        blocked in another library: receives.ReceiveLoop._next_turn), the cap is one lower in
        effect and nothing can deadlock on it.
        Held back for a peer whose count no send carries (the previous rank of a larger ring),
        it would reach the sender only when this rank waits: the sender found its slots taken
        and sent files. Those are counted at once.
        """
        with self._area_lock:
            near = range(max(0, src - RIDE_AREAS + 1), min(len(self._sent), src + RIDE_AREAS))
            carried = any(self._sent[peer] > 0 for peer in near)
            if src in self.ack_due or not carried:
                self.ack_due.pop(src, None)
                self._write_counters(src, self._counters_written(src)[0], received)
            else:
                self.ack_due[src] = received

    def flush_acknowledgements(self) -> None:
        """Write every acknowledgement held back (this rank is about to wait, or enters a collective)."""
        if not self.ack_due:
            return
        with self._area_lock:
            for src, received in self.ack_due.items():
                self._write_counters(src, self._counters_written(src)[0], received)
            self.ack_due.clear()

    def _received_to_write(self, peer: int) -> int:
        """The received count for ``peer`` that a write of its counters carries (the area lock is held)."""
        due = self.ack_due.pop(peer, None)
        return self._counters_written(peer)[1] if due is None else due

    def _counters_written(self, peer: int) -> tuple[int, int]:
        """(sent, received) as this rank last wrote them for ``peer`` (the area lock is held)."""
        return state_record.decode_pair(
            bytes(self._areas[peer][: state_record.PAIR_COUNTERS_SIZE]), peer, self._own_seal
        )

    def _write_counters(self, peer: int, sent: int, received: int) -> None:
        """Write both counters for ``peer``, alone (the area lock is held)."""
        end = self._set_counters(peer, sent, received)
        self._progress.write_own(bytes(self._areas[peer][:end]), state_record.pair_offset(peer))

    def _set_counters(self, peer: int, sent: int, received: int) -> int:
        """Put both counters (they share a CRC) into ``peer``'s area image, the one every write of
        the area is taken from; returns their size (the area lock is held)."""
        counters = state_record.encode_pair(sent, received, peer, self._own_seal)
        self._areas[peer][: len(counters)] = counters
        return len(counters)

    def open(self, src: int, index: int) -> Incoming:
        """Message ``index`` from ``src`` (of those ``sent_to_me`` counted): inline, in its ring, or a file.

        A lockless record's area may have been read while the send that wrote its counters and
        the slot in one write was under way: counters that count the message beside a torn or
        older slot, and no file (a file is published before its counters). It is read again: a
        torn slot while ``TornReads`` allows, a missing one until the group's deadline (on NFS
        the rest of the write may come a request later)."""
        progress = self._progress
        where = f"{progress.state_path(src)} (message #{index} to rank {progress.rank})"
        check = self._seal(src, progress.rank, index)
        torn = TornReads()

        def opened() -> Incoming | None:
            try:
                slot = self._find(src, index)
                incoming = open_incoming(
                    slot, where, lambda: os.path.join(self.directory, layout.p2p_name(src, progress.rank, index)),
                    lambda: self._ring_to_read(src), check, self._mapped,
                )  # fmt: skip
            except (FileNotFoundError, ProtocolError) as exc:
                if not progress.lockless or (isinstance(exc, ProtocolError) and torn.past()):
                    raise  # (a ProtocolError: torn for a moment, or damaged for good)
                self._take_area(src, locked=True)  # (a missing slot: the rest of the write may come later)
                return None
            if slot is not None:
                self._inline_open.add((src, index))
            return incoming

        found = opened()  # the usual case: no deadline, no wait
        if found is not None:
            return found
        missing = lambda: progress.timed_out(src, f"message #{index}, which its counters announce")  # noqa: E731
        return self._waiter.by_looking(opened, progress.deadline(), missing, lambda _: progress.check_health(src))

    def _seal(self, src: int, dst: int, index: int) -> Seal:
        return self._progress.p2p_seal(src, dst, index)

    def discard(self, src: int, index: int, size: int) -> None:
        """The receiver disposes of a message it consumed (its only reader): a spare, or deleted;
        an inline one is freed by the acknowledgement."""
        if (src, index) in self._inline_open:
            self._inline_open.discard((src, index))
            return
        path = os.path.join(self.directory, layout.p2p_name(src, self._progress.rank, index))
        self._outbox.spares.give_back(path, size)

    def wait_for_sends(
        self, attempt: Callable[[], bool | None], end: float, health_check: Callable[[], None], spin: bool = True
    ) -> bool:
        """Call ``attempt`` until it returns True (True) or ``end`` passes (False), pausing on this
        rank's point-to-point bell between attempts (Waiter.for_sends); acknowledgements held
        back are written before each pause (a sender may be waiting for them)."""
        return self._waiter.for_sends(attempt, end, health_check, self.flush_acknowledgements, spin)

    def check_health(self, peer: int | None = None) -> None:
        self._progress.check_health(peer)

    def abort(self, reason: str) -> None:
        self._progress.abort(reason)

    def _ring_to_read(self, src: int) -> tuple[int, str]:
        return self._read_rings.open(os.path.join(self.directory, layout.ring_name(src, self._progress.rank)))

    def close(self) -> None:
        self._bell.close()
        for ring in self._send_rings.values():
            ring.close()
        self._send_rings.clear()
        self._read_rings.close()

    def _read_received_by(self, dst: int) -> int:
        """How many of this rank's messages ``dst`` has consumed, read from its pair area for us.

        Optimistic groups read the counters without the lock first, as ``sent_to_me`` does: a
        sender that never receives from ``dst`` (a ring of 3 or more) learns its count only
        here, on nearly every send once its slots are in use (4-rank 8-byte ring: a locked read,
        2 lock calls, per send). A read torn by ``dst``'s write fails the counters' CRC, and a
        count above what was sent cannot be one: either is read again under the lock."""
        offset, where = state_record.pair_offset(self._progress.rank), self._progress.state_path(dst)
        sent = self._sent[dst]
        _, (_, received), _ = self._progress.read_peer(
            dst, offset, state_record.PAIR_COUNTERS_SIZE,
            lambda raw: state_record.decode_pair(raw, self._progress.rank, self._progress.seals[dst], where),
            plausible=lambda counts: 0 <= counts[1] <= sent,
        )  # fmt: skip
        self._received_by[dst] = max(self._received_by[dst], received)
        return self._received_by[dst]

    def _wait_for_receiver(self, dst: int) -> None:
        progress = self._progress
        self.flush_acknowledgements()  # (``dst`` may be waiting for this rank's sends to move on, too)

        def room() -> bool | None:
            return True if self._sent[dst] - self._read_received_by(dst) < MAX_UNRECEIVED_SENDS else None

        what = f"receives of this rank's sends (at most {MAX_UNRECEIVED_SENDS} may wait unreceived)"
        self._waiter.by_looking(
            room, progress.deadline(), lambda: progress.timed_out(dst, what), lambda _: progress.check_health(dst)
        )
