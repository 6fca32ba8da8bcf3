"""Point-to-point receives with MPI's matching rules over the transport's per-pair messages.

Sends are buffered: a send places its message (a record slot, a ring file or a file of its own:
transport/outbox.py) and bumps the sender's count for that receiver,
then returns. A receive matches the *first* message from its source (or from any source) whose
tag it asks for; messages with other tags wait for the receives that want them. Pending
receives are matched in the order they were posted, so two receives of one (source, tag) get
messages in the order they were sent (MPI's non-overtaking rule).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import DesyncError, FsdistTimeoutError
from ..files.waiting import Deadline
from .interfaces import Incoming, PointToPointChannel

__all__ = ["Mailbox", "PendingReceive"]


@dataclass(eq=False)
class PendingReceive:
    """One posted receive: where from (None: any source), which tag, into which tensors."""

    source: int | None
    tag: int
    tensors: Sequence[torch.Tensor]
    deadline: Deadline
    matched_source: int | None = field(default=None)


class Mailbox:
    """Matches posted receives against the messages peers have sent to this rank."""

    def __init__(self, transport: PointToPointChannel) -> None:
        self._t = transport
        size = transport.size
        self._first_unconsumed = [0] * size
        self._received = [0] * size
        self._consumed_ahead: list[set[int]] = [set() for _ in range(size)]
        self._tags: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._snapshot: dict[int, int] = {}
        self._peeked: tuple[tuple[int, int], Incoming] | None = None
        #: messages in a record slot or a ring that a pass left for a later receive. The sender
        #: reuses that space once this rank has consumed *as many* messages as that needs, not
        #: those very ones: a receive matched out of order (another tag first) would find a
        #: message it passed over rewritten. So its bytes are copied when it is passed over (at
        #: most MAX_UNRECEIVED_SENDS messages of ≤ RING_MESSAGE_MAX per peer).
        self._held: dict[tuple[int, int], Incoming] = {}

    def begin_pass(self) -> None:
        """Start a matching pass over the posted receives.

        Within a pass every receive sees the same arrived messages. Otherwise a message arriving
        mid-pass could go to a later receive although an earlier one (same source and tag) was
        tried just before it arrived, breaking the non-overtaking rule.
        """
        self._snapshot.clear()

    def try_receive(self, receive: PendingReceive) -> bool:
        """Match and complete ``receive`` if a message for it has arrived; True if it did."""
        sources = range(self._t.size) if receive.source is None else [receive.source]
        with self._lock:
            for source in sources:
                index = self._find(source, receive.tag)
                if index is not None:
                    self._consume(source, index, receive)
                    receive.matched_source = source
                    return True
        if receive.deadline.expired():
            where = "any rank" if receive.source is None else f"rank {receive.source}"
            raise FsdistTimeoutError(
                f"rank {self._t.rank}: recv from {where} with tag {receive.tag}: Timed out after "
                f"{receive.deadline.seconds:.1f} s; no matching message arrived in {self._t.directory}"
            )
        return False

    def _find(self, source: int, tag: int) -> int | None:
        if source == self._t.rank:
            return None
        if source not in self._snapshot:
            self._snapshot[source] = self._t.sent_to_me(source)
        available = self._snapshot[source]
        for index in range(self._first_unconsumed[source], available):
            if index in self._consumed_ahead[source]:
                continue
            if self._tag_of(source, index) == tag:
                return index
            self._pass_over(source, index)
        return None

    def _pass_over(self, source: int, index: int) -> None:
        """Keep a message this pass leaves for a later receive where its sender may reuse its space
        once a later message is consumed (a ring message: copied out now; see ``_held``)."""
        key = (source, index)
        if self._peeked is not None and self._peeked[0] == key and self._peeked[1].file_size() == 0:
            msg = self._peeked[1]  # in the record or a ring (a file stays until discarded)
            self._peeked = None
            self._held[key] = msg.keep()
            msg.close()

    def _tag_of(self, source: int, index: int) -> int:
        key = (source, index)
        if key not in self._tags:
            # kept open: the message whose tag was just read is usually the one consumed next
            self._close_peeked()
            msg = self._t.open(source, index)
            self._peeked = (key, msg)
            self._tags[key] = msg.tag
        return self._tags[key]

    def _close_peeked(self) -> None:
        if self._peeked is not None:
            self._peeked[1].close()
            self._peeked = None

    def _open(self, source: int, index: int) -> Incoming:
        held = self._held.pop((source, index), None)
        if held is not None:
            return held
        if self._peeked is not None and self._peeked[0] == (source, index):
            msg = self._peeked[1]
            self._peeked = None
            return msg
        return self._t.open(source, index)

    def close(self) -> None:
        """Release the message held open since its tag was read (the receive loop has stopped)."""
        with self._lock:
            self._close_peeked()
            self._held.clear()

    def _consume(self, source: int, index: int, receive: PendingReceive) -> None:
        with self._open(source, index) as msg:
            self._check_matches(source, index, msg.parts, msg.description, receive.tensors)
            for part, tensor in enumerate(receive.tensors):
                msg.read_into(part, tensor)
            size = msg.file_size()
        self._t.discard(source, index, size)
        self._tags.pop((source, index), None)
        consumed = self._consumed_ahead[source]
        consumed.add(index)
        while self._first_unconsumed[source] in consumed:
            consumed.remove(self._first_unconsumed[source])
            self._first_unconsumed[source] += 1
        self._received[source] += 1
        self._t.acknowledge(source, self._received[source])

    def _check_matches(
        self, source: int, index: int, parts: Sequence[Any], description: str, tensors: Sequence[torch.Tensor]
    ) -> None:
        sent = [(p.dtype, p.nbytes) for p in parts]
        expected = [(t.dtype, t.numel() * t.element_size()) for t in tensors]
        if sent != expected:
            theirs = ", ".join(f"{p.dtype} {list(p.shape)}" for p in parts)
            mine = ", ".join(f"{t.dtype} {list(t.shape)}" for t in tensors)
            error = DesyncError(
                f"rank {self._t.rank}: message #{index} from rank {source} ('{description}') holds [{theirs}] "
                f"but the matching recv expects [{mine}]"
            )
            self._t.abort(str(error))
            raise error
