"""The files of one process group: per-rank progress records and published messages.

Each rank owns one *state record* (``state.r<rank>``), written only by that rank under an fcntl
lock: the collective sequence number it is in, the step within it it has published, a text
description of the operation, and per destination the number of point-to-point messages it has
sent. Peers learn that a message exists by reading that record, never by stat-ing a name that
may not exist yet (NFS caches the absence of a name for up to a minute).

Messages are files written once (``fileio.publish``) and named by what they are, so a reader
that knows (peer, sequence, step) knows the path. The transport knows nothing of collectives:
sequence numbers, steps and descriptions are opaque to it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Sequence

import torch

from ..defaults import (
    ENV_REUSE_FILES,
    GC_BYTES,
    GC_EVERY,
    MAX_UNRECEIVED_SENDS,
    REUSE_FILES,
    REUSE_MIN_BYTES,
    RUN_AHEAD,
)
from ..errors import DesyncError, FsdistTimeoutError, PeerFailedError
from ..files.doorbell import Doorbell
from ..files.io import make_private_dir, publish, remove_tree
from ..files.locks import Counter, LockedRecord
from ..files.waiting import Deadline, poll
from ..fs.mounts import is_local
from ..job.liveness import PeerWatch
from ..protocol import layout, message, state_record
from ..protocol.state_record import PeerState
from .spares import SpareFile, SparePool

log = logging.getLogger(__name__)

__all__ = ["GroupTransport", "PeerState"]

_HISTORY = 4096  # own history hashes kept to compare with peers that lag behind


class GroupTransport:
    """Publishing and reading messages among the ranks of one group through its directory."""

    def __init__(self, directory: str, rank: int, size: int, watch: PeerWatch, timeout: float) -> None:
        make_private_dir(directory)
        self.directory = directory
        self.rank = rank
        self.size = size
        self.watch = watch
        self.timeout = timeout
        self._records = [LockedRecord(self._state_path(r)) for r in range(size)]
        self._abort = LockedRecord(os.path.join(directory, layout.ABORT_FILE))
        self._seq = 0
        self._step = 0
        self._flags = 0
        self._description = ""
        self._sent = [0] * size
        self._send_lock = threading.Lock()
        self._peer_seq = [-1] * size
        # (seq, path, bytes, the spare it was written through), oldest first
        self._published: deque[tuple[int, str, int, SpareFile | None]] = deque()
        self._published_bytes = 0
        self.spares = SparePool(directory, rank, _reuse_files(directory), REUSE_FILES, REUSE_MIN_BYTES)
        # running hash of every description so far, per seq: two ranks whose hashes differ at
        # the same seq called different operations somewhere, even if neither waited then
        self._chain = 0
        self._history: dict[int, tuple[int, str]] = {0: (0, "")}
        self._history_order: deque[int] = deque([0])
        self._others = [r for r in range(size) if r != rank]
        self._bell = Doorbell([layout.doorbell_file(directory, r) for r in range(size)], rank)
        # receives are matched on their own thread: a bell of their own, so neither waiter
        # swallows the other's wake-up
        self._p2p_bell = Doorbell([layout.p2p_doorbell_file(directory, r) for r in range(size)], rank)
        self._write_state()

    @property
    def maps_messages(self) -> bool:
        """Whether peers' messages may be mapped (local filesystems, where spares are used too)."""
        return self.spares.enabled

    # ---- own progress -------------------------------------------------------------------

    def enter(self, seq: int, description: str) -> None:
        """Announce that this rank started operation ``seq``, described by ``description``."""
        self._seq, self._step, self._description = seq, 0, description[: state_record.DESCRIPTION_MAX]
        self._chain = state_record.chain(self._chain, description)
        self._history[seq] = (self._chain, self._description)
        self._history_order.append(seq)
        if len(self._history_order) > _HISTORY:
            self._history.pop(self._history_order.popleft(), None)
        self._write_state()
        if seq % GC_EVERY == 0 or self._published_bytes > GC_BYTES or self._spare_in_reach():
            self.collect_garbage()  # also compares peers' history hashes with this rank's
        if seq % GC_EVERY == 0:
            reason = self.abort_reason()  # a rank that never waits must still hear of failures
            if reason is not None:
                raise PeerFailedError(f"{self._where()}: the group was aborted: {reason}")
        if self._published and seq - self._published[0][0] > RUN_AHEAD:
            self._wait_for_stragglers()

    def _spare_in_reach(self) -> bool:
        """Whether the oldest uncollected message would become a spare: collect it now, not later."""
        return bool(self._published) and self.spares.wants(self._published[0][2])

    def _wait_for_stragglers(self) -> None:
        """Block until the slowest peer is within RUN_AHEAD / 2 operations of this rank."""

        def caught_up() -> bool | None:
            self.collect_garbage()
            return True if not self._published or self._seq - self._published[0][0] <= RUN_AHEAD // 2 else None

        def timed_out() -> BaseException:
            slowest = min((r for r in range(self.size) if r != self.rank), key=lambda r: self._peer_seq[r])
            return self._timed_out(slowest, f"operation #{self._seq - RUN_AHEAD // 2}")

        # every peer's health, not just the one that looked slowest: cached positions go stale
        poll(caught_up, self._deadline(), timed_out, lambda: self._check_health(None), self._bell.wait)

    def publish(self, step: int, tensors: Sequence[torch.Tensor], tag: int = 0) -> None:
        """Publish this rank's message for (current seq, ``step``), then advance the record."""
        name = layout.message_name(self.rank, self._seq, step)
        buffers = message.encode(self._seq, tag, self._description, tensors)
        size = sum(len(b) for b in buffers)
        path, spare = self._write_message(name, buffers, size)
        self._published.append((self._seq, path, size, spare))
        self._published_bytes += size
        self.advance(step)

    def _write_message(
        self, name: str, buffers: Sequence[memoryview | bytes], size: int
    ) -> tuple[str, SpareFile | None]:
        """Publish ``name`` through a spare where one is kept, else as a fresh file."""
        spare = self.spares.take(size)
        if spare is None:
            return publish(self.directory, name, buffers), None
        path = os.path.join(self.directory, name)
        spare.publish(path, buffers)
        return path, spare

    def advance(self, step: int) -> None:
        """Announce step ``step`` of the current operation (published, or a message-less step).

        Only steps ring the peers' doorbells: a peer waits for a step, never for ``enter``
        alone, so ringing there would wake (and on shared cores, preempt for) nothing.
        """
        self._step = step
        self._write_state()
        self._bell.ring(self._others)  # after the record: a woken peer finds what it waits for

    def _write_state(self) -> None:
        record = state_record.encode(self._seq, self._step, self._description, self._chain, self._flags)
        self._records[self.rank].write(record)

    # ---- peers --------------------------------------------------------------------------

    def peer_state(self, peer: int) -> PeerState:
        theirs = state_record.decode(self._records[peer].read(0, state_record.HEADER_SIZE), self._state_path(peer))
        if theirs is state_record.NOT_STARTED:
            return theirs
        seq = theirs.seq
        self._peer_seq[peer] = max(self._peer_seq[peer], seq)
        mine = self._history.get(seq)
        if mine is not None and mine[0] != theirs.history and seq <= self._seq:
            if seq == self._seq and theirs.description != self._description:
                raise self._desync(peer, theirs.description)
            raise self._diverged(peer, seq, theirs.description)
        return theirs

    def _diverged(self, peer: int, seq: int, theirs: str) -> DesyncError:
        error = DesyncError(
            f"{self._where()}: rank {peer} called different operations from this rank at or before "
            f"operation #{seq} (this rank's #{seq} was '{self._history[seq][1]}', rank {peer}'s is '{theirs}'; "
            "every rank of a group must call the same collectives in the same order)"
        )
        self.abort(str(error))
        return error

    def wait_for(self, peer: int, step: int) -> None:
        """Block until ``peer`` has published (current seq, ``step``) or gone past it.

        Raises DesyncError if the peer is in the same sequence number doing something else.
        """
        want = (self._seq, step)

        def arrived() -> bool | None:
            state = self.peer_state(peer)
            if state.seq == self._seq and state.description != self._description:
                raise self._desync(peer, state.description)
            if state.position >= want:
                return True
            if state.closed:
                raise PeerFailedError(
                    f"{self._where()}: rank {peer} closed the group while this rank waited for its step {step}"
                )
            return None

        poll(
            arrived,
            self._deadline(),
            lambda: self._timed_out(peer, f"step {step}"),
            lambda: self._check_health(peer),
            self._bell.wait,
        )

    def open_message(self, peer: int, step: int) -> message.Message:
        """Open ``peer``'s message for (current seq, ``step``); call ``wait_for`` first."""
        try:
            msg = message.Message(os.path.join(self.directory, layout.message_name(peer, self._seq, step)))
        except FileNotFoundError:
            # the peer went past this operation without publishing this step: it ran another one
            state = self.peer_state(peer)
            raise self._desync(
                peer, f"(moved on to #{state.seq} '{state.description}' without publishing step {step})"
            ) from None
        if msg.seq != self._seq or msg.description != self._description:
            msg.close()
            raise self._desync(peer, msg.description)
        return msg

    def _desync(self, peer: int, theirs: str) -> DesyncError:
        error = DesyncError(
            f"{self._where()}: ranks disagree on operation #{self._seq}: "
            f"rank {self.rank} called '{self._description}', rank {peer} called '{theirs}'"
        )
        self.abort(str(error))
        return error

    # ---- point to point -----------------------------------------------------------------

    def send(self, dst: int, tensors: Sequence[torch.Tensor], tag: int, description: str) -> int:
        """Publish a message to ``dst`` (buffered: never waits for the receiver). Returns its index."""
        with self._send_lock:  # threads sending at once must not take the same index
            if self._sent[dst] >= MAX_UNRECEIVED_SENDS:
                self._wait_for_receiver(dst)
            index = self._sent[dst]
            name = layout.p2p_name(self.rank, dst, index)
            buffers = message.encode(index, tag, description, tensors)
            _, spare = self._write_message(name, buffers, sum(len(b) for b in buffers))
            if spare is not None:
                spare.close(remove=False)  # the receiver owns the file now; this rank forgets it
            self._sent[dst] = index + 1
            self._records[self.rank].write(state_record.encode_counter(index + 1), state_record.sent_offset(dst))
            self._p2p_bell.ring([dst])
        return index

    def sent_to_me(self, src: int) -> int:
        """How many messages ``src`` has sent to this rank so far."""
        return self._read_slot(src, state_record.sent_offset(self.rank))

    def acknowledge(self, src: int, received: int) -> None:
        """Tell ``src`` that this rank has received ``received`` of its messages (its send cap)."""
        offset = state_record.received_offset(src, self.size)
        self._records[self.rank].write(state_record.encode_counter(received), offset)

    def _wait_for_receiver(self, dst: int) -> None:
        def room() -> bool | None:
            received = self._read_slot(dst, state_record.received_offset(self.rank, self.size))
            return True if self._sent[dst] - received < MAX_UNRECEIVED_SENDS else None

        what = f"receives of this rank's sends (at most {MAX_UNRECEIVED_SENDS} may wait unreceived)"
        poll(room, self._deadline(), lambda: self._timed_out(dst, what), lambda: self._check_health(dst))

    def _read_slot(self, rank: int, offset: int) -> int:
        return state_record.decode_counter(self._records[rank].read(offset, state_record.COUNTER_SIZE))

    def wait_for_sends(self, seconds: float) -> None:
        """Sleep up to ``seconds``, less if a peer sends this rank a message meanwhile."""
        self._p2p_bell.wait(seconds)

    def open_p2p(self, src: int, index: int) -> message.Message:
        return message.Message(os.path.join(self.directory, layout.p2p_name(src, self.rank, index)))

    def discard_p2p(self, src: int, index: int, size: int) -> None:
        """The receiver disposes of a message it consumed (its only reader): keeps it as a spare or deletes it."""
        self.spares.give_back(os.path.join(self.directory, layout.p2p_name(src, self.rank, index)), size)

    # ---- health, deadlines, errors ------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Mark the group failed so every peer's waits end at once with ``reason``."""
        self._abort.update(lambda old: None if old else reason.encode())

    def abort_reason(self) -> str | None:
        raw = self._abort.read()
        return raw.decode(errors="replace") if raw else None

    def check_health(self, peer: int | None = None) -> None:
        """Raise PeerFailedError if the group was aborted or ``peer`` died on this host."""
        self._check_health(peer)

    def _check_health(self, peer: int | None) -> None:
        reason = self.abort_reason()
        if reason is not None:
            raise PeerFailedError(f"{self._where()}: the group was aborted: {reason}")
        peers = range(self.size) if peer is None else [peer]
        for other in peers:
            reason = self.watch.dead_reason(other) if other != self.rank else None
            if reason:
                raise PeerFailedError(f"{self._where()}: {reason} while this rank waited for it")

    def _deadline(self) -> Deadline:
        return Deadline(self.timeout)

    def _timed_out(self, peer: int, what: str) -> FsdistTimeoutError:
        state = self.peer_state(peer)
        behind = [r for r in range(self.size) if r != self.rank and self.peer_state(r).seq < self._seq]
        return FsdistTimeoutError(
            f"{self._where()}: Timed out after {self.timeout:.1f} s waiting for rank {peer} to publish {what}; "
            f"its record {self._state_path(peer)} says it is at operation #{state.seq} step {state.step} "
            f"('{state.description}'); ranks that have not reached operation #{self._seq}: {behind}"
        )

    def _where(self) -> str:
        return f"rank {self.rank}, operation #{self._seq} '{self._description}'"

    def deadline(self) -> Deadline:
        return self._deadline()

    # ---- garbage collection and closing -------------------------------------------------

    def collect_garbage(self) -> None:
        """Delete own messages of operations every peer has finished (they moved past them)."""
        if not self._published:
            return
        for peer in range(self.size):
            if peer != self.rank and self._peer_seq[peer] <= self._published[0][0]:
                self.peer_state(peer)
        done_below = min((s for r, s in enumerate(self._peer_seq) if r != self.rank), default=self._seq + 1)
        while self._published and self._published[0][0] < done_below:
            # every peer has moved past this operation: none has the file open or looks it up again
            _, path, size, spare = self._published.popleft()
            self._published_bytes -= size
            self.spares.give_back(path, size, spare)

    def close(self) -> bool:
        """Leave the group. The last rank to leave removes the group directory; returns True then."""
        self._flags |= state_record.FLAG_CLOSED
        self._write_state()
        self._bell.ring(self._others)
        for _, _, _, spare in self._published:
            if spare is not None:
                spare.close(remove=False)  # unmapped; the file itself goes with the directory
        self.spares.close()  # before counting out: the last rank removes the directory
        closed = Counter(os.path.join(self.directory, layout.CLOSED_FILE))
        try:
            last = closed.add(1) == self.size
        finally:
            closed.close()
        for record in (*self._records, self._abort):
            record.close()
        self._bell.close()
        self._p2p_bell.close()
        self.watch.close()
        if last:
            remove_tree(self.directory)
        return last

    def _state_path(self, rank: int) -> str:
        return layout.state_file(self.directory, rank)


def _reuse_files(directory: str) -> bool:
    """Whether retired message files may be rewritten here: local filesystems only.

    On a network filesystem another client may still cache the old pages of a rewritten
    inode (default GlusterFS does; NFS revalidates on open, but only as finely as its change
    attribute): a fresh file per message is the path that is correct everywhere.
    """
    setting = os.environ.get(ENV_REUSE_FILES, "")
    if setting in ("0", "1"):
        return setting == "1"
    return is_local(directory)
