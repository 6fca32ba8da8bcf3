"""Where every rank of a group is: its own state record, its peers' records, and the waits on them.

Each rank owns one state record (protocol/state_record.py), written only by that rank (under an
fcntl lock, or none: Locality.record_kind): the operation it is in, the step of it it has reached, the
operation's description and the hash of every description so far. Peers learn that a step (and
its message) exists by reading that record, never by stat-ing a name that may not exist yet (NFS caches
the absence of a name for up to a minute). The same reads detect desynchronised calls: a peer
in this operation with another description, or whose history hash differs from this rank's at
the same operation, called something else.

Every wait ends at the group's deadline, or earlier when the group is aborted or the peer dies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..errors import DesyncError, FsdistTimeoutError, PeerFailedError, ProtocolError
from ..files.doorbell import Doorbell
from ..files.locks import LockedRecord, TornReads
from ..files.seal import Seal, sealer
from ..files.waiting import Deadline, Waiter, poll
from ..job.liveness import PeerWatch
from ..protocol import layout, state_record
from ..protocol.state_record import PeerState
from .abort import AbortRecord
from .history import History, disagree, diverged

T = TypeVar("T")

__all__ = ["Progress"]


class Progress:
    """This rank's position in a group's operations, and what its peers' records say of theirs."""

    def __init__(
        self, directory: str, rank: int, size: int, watch: PeerWatch, timeout: float,
        names: Sequence[int] | None = None, tier: str = "", record_kind: type[LockedRecord] = LockedRecord,
    ) -> None:  # fmt: skip
        """``names``: each rank's number in the process group, where this is one tier of it
        (errors name group ranks); ``tier``: which tier, for the same errors. ``record_kind``:
        the class of the group's records (Locality.record_kind)."""
        self.directory = directory
        #: peers' records are read without the lock first (``read_peer``)
        self.optimistic = record_kind.reads_unlocked
        #: and no lock guards them: a read may show a step before its slot (``inline_message``)
        self.lockless = record_kind.lockless
        self.rank = rank
        self.size = size
        self.names = list(names) if names is not None else list(range(size))
        self._tier = f" ({tier})" if tier else ""
        self.watch = watch
        self.timeout = timeout
        self.seq = 0
        self.step = 0
        self.description = ""
        self._flags = 0
        self._state_paths = [layout.state_file(directory, r) for r in range(size)]  # named in every error
        #: each rank's record's seal (files/seal.py): its header's and its pair counters' tags
        self._sealer = sealer()  # (the settings the group was created with: files/seal.py)
        self.seals = [self._sealer.seal(layout.identity(path)) for path in self._state_paths]
        self._identity = layout.identity(directory)
        self._records = [record_kind(path, on_wait=self._lock_wait(r)) for r, path in enumerate(self._state_paths)]
        self.aborted = AbortRecord(directory, record_kind)
        #: the highest operation each peer was seen in, and the furthest (operation, step) it was
        #: seen at (garbage collection reads them)
        self.peer_seq = [-1] * size
        self.peer_position = [(-1, 0)] * size
        #: each peer's record as last read (position and inline messages: one read gives both)
        self._seen = [b""] * size
        self.history = History()
        self.others = [r for r in range(size) if r != rank]
        self.bell = Doorbell([layout.doorbell_file(directory, r) for r in range(size)], rank)
        self.waiter = Waiter(self.bell, size, looks_cost=record_kind.lockless)
        #: this rank's record as last written: a message goes out with the header in one pwrite
        self._mine = bytearray(state_record.POSITION_SIZE)
        #: entered an operation whose start the record does not show yet (see ``enter``)
        self._unwritten = False
        #: record writes come from the operation's thread, and an abort from any thread: one at a
        #: time, each with the header as it is then (never an older one over a newer one)
        self._write_lock = threading.Lock()
        # the whole position part at once (header and empty inline slots): a peer's read of it
        # is then one full pread, never a short one followed by another to find the end
        self._mine[: state_record.HEADER_SIZE] = self._header()
        self._records[self.rank].write(bytes(self._mine))

    # ---- this rank ----------------------------------------------------------------------

    def enter(self, seq: int, description: str) -> None:
        """Start operation ``seq``, described by ``description``.

        The record says so with this rank's first write in the operation (its first message or
        step) or, if it must wait before that, just before it waits: a peer learns of an
        operation no later than it could need to (to see a desync, to know what this rank waits
        for), and an operation that starts by publishing costs one record write, not two.
        """
        self.seq, self.step, self.description = seq, 0, state_record.fit(description)
        self.history.enter(seq, description, self.description)
        self._unwritten = True

    def flush(self) -> None:
        """Write the record if it does not show the operation this rank is in yet."""
        if self._unwritten:
            self._write()

    def advance(self, step: int, waiters: Sequence[int] | None = None) -> None:
        """Reach ``step`` of the current operation, and wake the peers that may wait for it
        (``waiters``, or every peer).

        Only steps wake the peers: a peer waits for a step, never for ``enter``
        alone, so waking them there would rouse (and on shared cores, preempt for) nothing.
        """
        self.step = step
        self._write()
        self.bell.wake(self.others if waiters is None else waiters)  # after the record: a woken peer finds it

    def advance_inline(self, step: int, slot: int, message: bytes, waiters: Sequence[int] | None = None) -> None:
        """Reach ``step`` with its message in inline slot ``slot``: one write of the record, from
        its start through the slot (the slots before it rewritten as they are)."""
        self.step = step
        start = state_record.slot_offset(slot)
        encoded = state_record.encode_slot(self.seq, step, message)
        with self._write_lock:
            self._mine[start : start + len(encoded)] = encoded
            self._mine[: state_record.HEADER_SIZE] = self._header()
            self._records[self.rank].write(bytes(self._mine[: start + len(encoded)]))
            self._unwritten = False
        self.bell.wake(self.others if waiters is None else waiters)

    def inline_message(self, peer: int, step: int, confirm: bool = True) -> bytes | None:
        """``peer``'s inline message of (current operation, ``step``), or None if it sent a file.

        Usually in the record as read by the wait that saw the step; read once more otherwise.
        Read without the lock, None only says *maybe* a file (a torn read can show the step
        beside an older slot): confirmed by a locked read (lockless records: ``_whole_inline``),
        unless ``confirm`` is False (the caller looks for the file first, then confirms)."""
        try:
            found = state_record.find_inline(self._seen[peer], self.seq, step)
        except ProtocolError:
            if not self.optimistic:
                raise
            found = None  # a slot torn by a write while read without the lock: read it locked
        if found is None and confirm and self.lockless:
            return self._whole_inline(peer, step) or None
        if found is None and confirm:
            self.peer_state(peer, locked=True)
            found = state_record.find_inline(self._seen[peer], self.seq, step)
        return found

    def _whole_inline(self, peer: int, step: int) -> bytes:
        """A lockless record's slot of ``step``, read until whole (b"": a later step, no slot: a
        file). A header at this step with no slot (and no file: the caller looked) was read
        mid-write, whose rest may come a request later (NFS): waited for like a step. A slot
        failing its CRC is torn while ``TornReads`` allows, then damaged."""
        torn = TornReads()

        def whole() -> bytes | None:
            theirs = self.peer_state(peer, locked=True)
            try:
                found = state_record.find_inline(self._seen[peer], self.seq, step)
            except ProtocolError:
                if torn.past():
                    raise
                return None
            return found if found is not None or theirs.position == (self.seq, step) else b""

        missing = lambda: self.timed_out(peer, f"step {step}'s slot, which its record announces")  # noqa: E731
        return poll(whole, Deadline(self.timeout), missing, lambda _: self.check_health(peer))

    def close(self) -> None:
        """Mark this rank's record closed (peers waiting for it fail at once) and let go of files."""
        self._flags |= state_record.FLAG_CLOSED
        self._write()
        self.bell.wake(self.others)
        for record in self._records:
            record.close()
        self.aborted.close()
        self.bell.close()
        self.watch.close()

    def _header(self) -> bytes:
        return state_record.encode(
            self.seq, self.step, self.description, self.history.chain, self._flags, self.seals[self.rank]
        )

    def _write(self) -> None:
        with self._write_lock:
            header = self._header()
            self._mine[: state_record.HEADER_SIZE] = header
            self._records[self.rank].write(header)
            self._unwritten = False

    def write_own(self, data: bytes, offset: int) -> None:
        """Bytes of this rank's record past its position part (the point-to-point pair areas)."""
        self._records[self.rank].write(data, offset)

    def read_peer(
        self, rank: int, offset: int, size: int, parse: Callable[[bytes], T],
        plausible: Callable[[T], bool] | None = None, locked: bool = False,
    ) -> tuple[bytes, T, bool]:  # fmt: skip
        """Bytes of ``rank``'s record (short where it never wrote them), what ``parse`` makes of
        them, and whether they were read without the lock: as the record's kind reads them
        (``read_checked``: files/locks.py and beside it; ``locked`` where it has a lock to read
        under). Every reader of a peer's record comes here."""
        return self._records[rank].read_checked(offset, size, parse, plausible, locked)

    # ---- peers --------------------------------------------------------------------------

    def peer_state(self, peer: int, locked: bool = False) -> PeerState:
        """``peer``'s record, compared with this rank's history (DesyncError on a divergence).

        Optimistic groups read it without the lock first (``read_peer``): a read torn by the
        peer's write fails the header's checksum (or a slot's, or finds an older slot beside a
        newer header: see ``inline_message``) and is read again under the lock.
        """
        where = self.state_path(peer)
        raw, theirs, _ = self.read_peer(
            peer,
            0,
            state_record.POSITION_SIZE,
            lambda raw: state_record.decode(raw, where, self.seals[peer]),
            locked=locked,
        )
        self._seen[peer] = raw
        if theirs is state_record.NOT_STARTED:
            return theirs
        if theirs.aborted:
            reason = self.aborted.reason() or f"rank {self.names[peer]}'s record says it aborted the group"
            raise PeerFailedError(f"{self.where()}: the group was aborted: {reason}")
        self.aborted.records_read = True
        seq = theirs.seq
        self.peer_seq[peer] = max(self.peer_seq[peer], seq)
        self.peer_position[peer] = max(self.peer_position[peer], theirs.position)
        ours = self.history.differs(seq, theirs.history)
        if ours is not None and seq <= self.seq:
            if seq == self.seq and theirs.description != self.description:
                raise self.desync(peer, theirs.description)
            raise self._diverged(peer, seq, ours, theirs.description)
        return theirs

    def wait_for(self, peer: int, step: int) -> None:
        """Block until ``peer`` has reached (current seq, ``step``) or gone past it.

        Raises DesyncError if the peer is in the same operation doing something else.
        """
        want = (self.seq, step)
        if self.peer_position[peer] >= want:  # seen there already (another part of its message)
            if self._unwritten and self.peer_seq[peer] > self.seq:
                self._tell_ahead(peer)
            return

        def arrived() -> bool | None:
            state = self.peer_state(peer)
            if state.seq == self.seq and state.description != self.description:
                raise self.desync(peer, state.description)
            if state.position >= want:
                return True
            if state.closed:
                raise PeerFailedError(
                    f"{self.where()}: rank {self.names[peer]} closed the group "
                    f"while this rank waited for its step {step}"
                )
            return None

        missed = self._unwritten
        if self._unwritten:  # about to wait: peers must see what this rank is in first
            if arrived():
                if self.peer_seq[peer] > self.seq:
                    self._tell_ahead(peer)
                return
            self._write()
        self.waiter.for_peer(
            peer, arrived, self.timeout, lambda: self.timed_out(peer, f"step {step}"),
            lambda _: self.check_health(peer), missed,
        )  # fmt: skip

    def _tell_ahead(self, peer: int) -> None:
        """Write this rank's position for ``peer``, found in a later operation already.

        A rank whose waits all end at once (a broadcast reader behind its root) would otherwise
        never write its record: the peer could not learn that its messages were read, so it
        kept them (no spare to reuse, no inline slot free, files piling up) until its run-ahead
        bound stopped it, and may be waiting for that now (Outbox.make_room): woken too.
        """
        self._write()
        self.bell.wake([peer])

    def desync(self, peer: int, theirs: str) -> DesyncError:
        """The error of ``peer`` calling ``theirs`` where this rank calls this operation (and abort)."""
        error = disagree(self.where(), self.seq, self.names[self.rank], self.description, self.names[peer], theirs)
        self.abort(str(error))
        return error

    def _diverged(self, peer: int, seq: int, ours: str, theirs: str) -> DesyncError:
        error = diverged(self.where(), seq, ours, self.names[peer], theirs)
        self.abort(str(error))
        return error

    # ---- health, deadlines, errors ------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Mark the group failed so every peer's waits end at once with ``reason`` (first wins):
        in the group's abort record, and as a flag in this rank's record, which peers read anyway."""
        self.aborted.mark(reason)
        self._flags |= state_record.FLAG_ABORTED
        self._write()
        self.bell.wake(self.others)

    def check_health(self, peer: int | None = None) -> None:
        """Raise PeerFailedError if the group was aborted, or ``peer`` (None: any) is dead."""
        reason = self.aborted.reason()
        if reason is not None:
            raise PeerFailedError(f"{self.where()}: the group was aborted: {reason}")
        for other in range(self.size) if peer is None else [peer]:
            reason = self.watch.dead_reason(other) if other != self.rank else None
            if reason:
                raise PeerFailedError(f"{self.where()}: {reason} while this rank waited for it")

    def deadline(self) -> Deadline:
        return Deadline(self.timeout)

    def _lock_wait(self, owner: int) -> Callable[[float], None]:
        """The judge of a long wait for the lock on ``owner``'s record: a peer stopped while it
        held the lock (its own record's, or this rank's as it read it) fails the wait as a
        stopped peer does, and the group's timeout bounds it."""
        path = self.state_path(owner)

        def judge(waited: float) -> None:
            self.check_health(owner if owner != self.rank else None)
            if waited >= self.timeout:
                raise FsdistTimeoutError(
                    f"{self.where()}: Timed out after {waited:.1f} s waiting for the lock on {path}, "
                    "which another process holds and does not let go"
                )

        return judge

    def timed_out(self, peer: int, what: str) -> FsdistTimeoutError:
        """The error of a wait for ``peer`` to publish ``what`` that ran out of time (c10d's words)."""
        state = self.peer_state(peer)
        behind = [self.names[r] for r in self.others if self.peer_state(r).seq < self.seq]
        return FsdistTimeoutError(
            f"{self.where()}: Timed out after {self.timeout:.1f} s "
            f"waiting for rank {self.names[peer]} to publish {what}; "
            f"its record {self.state_path(peer)} says it is at operation #{state.seq} step {state.step} "
            f"('{state.description}'); ranks that have not reached operation #{self.seq}: {behind}"
        )

    def where(self) -> str:
        return f"rank {self.names[self.rank]}{self._tier}, operation #{self.seq} '{self.description}'"

    def collective_seal(self, rank: int, step: int) -> Seal:
        """The seal of ``rank``'s message at ``step`` of the current operation, wherever it travels
        (inline, in a ring or as a file): bound to its sender, operation and step, this group and
        this job. (Without a key, the CRC's: no identity to spell out.)"""
        if self._sealer.key is None:
            return self.seals[rank]
        return self._sealer.seal(f"{self._identity}/{layout.message_name(rank, self.seq, step)}")

    def p2p_seal(self, src: int, dst: int, index: int) -> Seal:
        """The seal of message ``index`` from ``src`` to ``dst``, however it travels."""
        if self._sealer.key is None:
            return self.seals[src]
        return self._sealer.seal(f"{self._identity}/{layout.p2p_name(src, dst, index)}")

    def state_path(self, rank: int) -> str:
        return self._state_paths[rank]
