"""One process group's transport over files: the two channels (interfaces.py) on one directory.

Three parts, each a job of its own: ``Progress`` (this rank's state record, its peers', the waits
on them and desync detection), ``Retention`` (this rank's messages until its peers are past them,
spare files, the run-ahead bound) and ``Pairs`` (point-to-point messages and their counters).
GroupTransport joins them into what the collectives (a CollectiveChannel) and point-to-point
matching (a PointToPointChannel) see, and orders what happens when an operation starts.

Messages are files written once (files/io.py ``publish``, or rewritten spares) and named by what
they are (protocol/layout.py), so a reader that knows (peer, operation, step) knows the path.
The transport knows nothing of collectives: operations, steps and descriptions are opaque to it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from ..defaults import COLLECTIVE_RING_MAX, GC_EVERY, INLINE, RING_BYTES
from ..errors import PeerFailedError, ProtocolError
from ..files.io import open_file, remove_tree
from ..files.locks import Counter
from ..files.seal import Seal
from ..files.trust import make_private_dir
from ..files.waiting import Deadline
from ..fs.mounts import is_local
from ..job.liveness import PeerWatch
from ..protocol import layout, message, state_record
from ..protocol.state_record import PeerState
from .pairs import Pairs
from .progress import Progress
from .retention import Retention

__all__ = ["GroupTransport"]


class GroupTransport:
    """Publishing and reading messages among the ranks of one group through its directory."""

    def __init__(
        self, directory: str, rank: int, size: int, watch: PeerWatch, timeout: float,
        names: Sequence[int] | None = None, tier: str = "", one_client: bool = False,
    ) -> None:  # fmt: skip
        """``names`` and ``tier``: for one tier of a two-tier group (Progress). ``one_client``:
        every rank reaches ``directory`` through one client (see CollectiveChannel)."""
        make_private_dir(directory)
        self.directory = directory
        self.one_client = one_client
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.progress = Progress(
            directory, rank, size, watch, timeout, names, tier, optimistic=one_client and is_local(directory)
        )
        self._entered = 0
        self.retention = Retention(self.progress)
        self._mapped = self.retention.spares.mapped if self.maps_messages else None
        self._peer_rings: dict[int, int] = {}  # descriptors of peers' ring files, opened when first read
        self.pairs = Pairs(self.progress, self.retention)

    # ---- an operation starts ------------------------------------------------------------

    def enter(self, seq: int, description: str) -> None:
        """Announce that this rank started operation ``seq``, described by ``description``."""
        self.progress.enter(seq, description)
        self.pairs.flush_acknowledgements()  # a peer blocked on its send cap may be needed here
        self._entered += 1  # a tier of a two-tier group sees only some of the group's operations
        self.retention.collect_if_due(self._entered)
        if self._entered % GC_EVERY == 0:
            reason = self.progress.abort_known()  # a rank that never waits must still hear of failures
            if reason is not None:
                raise PeerFailedError(f"{self.progress.where()}: the group was aborted: {reason}")
        self.retention.hold_back_if_ahead(seq)

    # ---- CollectiveChannel --------------------------------------------------------------

    @property
    def maps_messages(self) -> bool:
        """Whether peers' messages may be mapped (local filesystems, where spares are used too)."""
        return self.retention.spares.enabled

    def publish(
        self, step: int, tensors: Sequence[torch.Tensor], tag: int = 0, readers: Sequence[int] | None = None
    ) -> None:
        """Publish this rank's message for (current operation, ``step``), then reach the step.

        A small message goes into a free inline slot of this rank's record, in the same locked
        write that announces the step; anything else (or with no slot free) into a file.
        ``readers`` (interfaces.py) lets its space be reused as soon as they are past it.
        """
        seq, description = self.progress.seq, self.progress.description
        check = self.progress.collective_seal(self.rank, step)
        encoded = (
            message.encode_inline(seq, tag, description, tensors, state_record.INLINE_MAX, check) if INLINE else None
        )
        if encoded is not None:
            slot = self.retention.free_slot()
            if slot is not None:
                self.progress.advance_inline(step, slot, encoded, readers)
                self.retention.keep_inline(seq, step, slot, readers)
                return
        buffers = message.encode(seq, tag, description, tensors, check)
        size = sum(len(b) for b in buffers)
        if (
            INLINE
            and encoded is None
            and size <= COLLECTIVE_RING_MAX
            and self._publish_in_ring(step, buffers, size, readers)
        ):
            return
        self.retention.make_room(size)
        path, spare = self.retention.write(layout.message_name(self.rank, seq, step), buffers, size)
        self.retention.keep(seq, step, path, size, spare, readers)
        self.progress.advance(step, readers)

    def _publish_in_ring(
        self, step: int, buffers: Sequence[memoryview | bytes], size: int, readers: Sequence[int] | None
    ) -> bool:
        """A mid-size message into this rank's ring file, and where it lies into a free inline
        slot with the step (local filesystems; False where there is no slot or no room)."""
        slot = self.retention.free_slot()
        placed = self.retention.place_in_ring(buffers, size) if slot is not None else None
        if slot is None or placed is None:
            return False
        offset, index = placed
        self.progress.advance_inline(step, slot, message.encode_ring_ref(offset, size), readers)
        self.retention.keep_inline(self.progress.seq, step, slot, readers, ring_index=index)
        return True

    def advance(self, step: int, waiters: Sequence[int] | None = None) -> None:
        self.progress.advance(step, waiters)

    def wait_for(self, peer: int, step: int) -> None:
        self.progress.wait_for(peer, step)

    def open_message(self, peer: int, step: int) -> message.Message | message.InlineMessage:
        """Open ``peer``'s message for (current operation, ``step``); call ``wait_for`` first."""
        progress = self.progress
        check = progress.collective_seal(peer, step)
        # optimistic reads: a file is opened before the record is read again under the lock to
        # confirm there is none (a message is either inline or a file, so a file found is it)
        inline = progress.inline_message(peer, step, confirm=not progress.optimistic)
        msg: message.Message | message.InlineMessage
        try:
            if inline is None and progress.optimistic:
                try:
                    return self._checked(peer, self._open_file(peer, step, check))
                except FileNotFoundError:
                    inline = progress.inline_message(peer, step)
            if inline is not None:
                try:
                    ring = message.parse_ring_ref(inline, RING_BYTES, progress.state_path(peer))
                    if ring is not None:
                        where = os.path.join(self.directory, layout.collective_ring_name(peer))
                        msg = message.Message.in_ring(self._ring_of(peer, where), *ring, where, check)
                    else:
                        msg = message.InlineMessage(inline, progress.state_path(peer), check)
                except ProtocolError as exc:  # (the context is only formatted when it is needed)
                    raise ProtocolError(f"{exc} (message of operation #{progress.seq} step {step})") from None
            else:
                msg = self._open_file(peer, step, check)
        except FileNotFoundError:
            # the peer went past this operation without publishing this step: it ran another one
            state = progress.peer_state(peer)
            raise progress.desync(
                peer, f"(moved on to #{state.seq} '{state.description}' without publishing step {step})"
            ) from None
        return self._checked(peer, msg)

    def _open_file(self, peer: int, step: int, check: Seal) -> message.Message:
        path = os.path.join(self.directory, layout.message_name(peer, self.progress.seq, step))
        return message.Message(path, check, mapped=self._mapped)

    def _checked(
        self, peer: int, msg: message.Message | message.InlineMessage
    ) -> message.Message | message.InlineMessage:
        """``msg``, if it is of the operation this rank is in (else a desync, on every rank)."""
        progress = self.progress
        if msg.seq != progress.seq or msg.description != progress.description:
            msg.close()
            raise progress.desync(peer, msg.description)
        return msg

    def _ring_of(self, peer: int, path: str) -> int:
        """A descriptor of ``peer``'s ring file (made before its first reference was published)."""
        fd = self._peer_rings.get(peer)
        if fd is None:
            fd = self._peer_rings[peer] = open_file(path, os.O_RDONLY)
        return fd

    def abort(self, reason: str) -> None:
        self.progress.abort(reason)

    # ---- PointToPointChannel ------------------------------------------------------------

    def send(self, dst: int, tensors: Sequence[torch.Tensor], tag: int, description: str) -> int:
        """Publish a message to ``dst`` (buffered: never waits for the receiver). Returns its index."""
        return self.pairs.send(dst, tensors, tag, description)

    def sent_to_me(self, src: int) -> int:
        return self.pairs.sent_to_me(src)

    def acknowledge(self, src: int, received: int) -> None:
        self.pairs.acknowledge(src, received)

    def open_p2p(self, src: int, index: int) -> message.Message | message.InlineMessage:
        return self.pairs.open(src, index)

    def discard_p2p(self, src: int, index: int, size: int) -> None:
        self.pairs.discard(src, index, size)

    def wait_for_sends(self, seconds: float) -> None:
        self.pairs.wait_for_sends(seconds)

    def flush_acknowledgements(self) -> None:
        self.pairs.flush_acknowledgements()

    def spin_for_sends(self, seconds: float) -> bool:
        return self.pairs.spin_for_sends(seconds)

    def sends_ring(self) -> bool:
        return self.pairs.sends_ring()

    # ---- health, for the adapter's receive loop and tools ---------------------------------

    def peer_state(self, peer: int) -> PeerState:
        return self.progress.peer_state(peer)

    def abort_reason(self) -> str | None:
        return self.progress.abort_reason()

    def check_health(self, peer: int | None = None) -> None:
        self.progress.check_health(peer)

    def deadline(self) -> Deadline:
        return self.progress.deadline()

    def collect_garbage(self) -> None:
        self.retention.collect()

    # ---- leaving --------------------------------------------------------------------------

    def close(self) -> bool:
        """Leave the group. The last rank to leave removes the group directory; returns True then."""
        self.pairs.flush_acknowledgements()  # a sender may still wait for them before it sees this rank leave
        self.progress.close()
        self.pairs.close()
        self.retention.close()  # before counting out: the last rank removes the directory
        for fd in self._peer_rings.values():
            os.close(fd)
        self._peer_rings.clear()
        with Counter(os.path.join(self.directory, layout.CLOSED_FILE)) as closed:
            last = closed.add(1) == self.size
        if last:
            remove_tree(self.directory)
        return last
