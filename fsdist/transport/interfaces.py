"""What the algorithms above may ask of a group's transport: two narrow, declared interfaces.

As Gloo's algorithms see only its ``gloo/transport/pair.h`` (in Gloo's repository), fsdist's
collectives see only a ``CollectiveChannel`` and its point-to-point matching only a
``PointToPointChannel``. The file
transport implements the first in group.py and the second in pairs.py; the tests'
memory_transport.py implements the first in one process, so every algorithm can be tested in
milliseconds without a file.

A collective is a sequence of numbered *steps* within the current operation: a rank publishes
the message of a step (or just announces a message-less step), peers wait until it has reached
that step, then read the message's parts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import torch

from ..job.nodes import Nodes
from ..protocol.message import Part
from .locality import Locality

__all__ = ["CollectiveChannel", "Incoming", "Locality", "Nodes", "PointToPointChannel", "TieredChannel"]


class Incoming(Protocol):
    """A peer's message, open for reading (a context manager that closes it)."""

    @property
    def parts(self) -> Sequence[Part]:
        """What each part is and where it lies (shared between messages: never changed)."""

    seq: int
    tag: int
    description: str

    def read_into(self, index: int, dest: torch.Tensor, byte_offset: int = 0) -> None:
        """Copy part ``index`` (from ``byte_offset`` on, as many bytes as ``dest`` holds) into ``dest``."""

    def mapped(self, index: int, like: torch.Tensor, byte_offset: int = 0) -> AbstractContextManager[torch.Tensor]:
        """Part ``index`` as a read-only tensor shaped like ``like``, without a copy where
        possible, valid for the ``with`` block (which may outlive the message's closing)."""

    def file_size(self) -> int:
        """Bytes the message occupies (what disposing of it frees)."""

    def keep(self) -> Incoming:
        """The message, readable after its sender may reuse its space (a copy where it lives in
        space the sender reuses once the reader counts it received)."""

    def close(self) -> None: ...

    def __enter__(self) -> Incoming: ...

    def __exit__(self, *exc: object) -> None: ...


class CollectiveChannel(Protocol):
    """What a collective algorithm may use (the caller has entered the operation already)."""

    rank: int
    size: int

    #: what the group's directory is to its ranks: algorithms choose their form by it
    #: (``one_client`` is the same on every rank) and map large parts where ``maps_messages``
    locality: Locality

    def publish(
        self, step: int, tensors: Sequence[torch.Tensor], tag: int = 0, readers: Sequence[int] | None = None
    ) -> None:
        """Publish this rank's message of ``step`` (the tensors as its parts) and reach the step.

        ``readers``: the only ranks that will open it (None: any peer may). The transport may
        then reuse its space once those ranks are past ``step``, with no need to learn where
        the other ranks are; a reader must have read it before it reaches a later step.
        """

    def advance(self, step: int, waiters: Sequence[int] | None = None) -> None:
        """Reach ``step`` without a message (a barrier, a rank with nothing to send).

        ``waiters``: the only ranks that wait for this step (None: any peer may); the others
        need not be woken. (A message's ``readers`` are its step's waiters likewise.)
        """

    def wait_for(self, peer: int, step: int) -> None:
        """Return once ``peer`` has reached ``step`` of this operation (or gone past it)."""

    def open_message(self, peer: int, step: int) -> Incoming:
        """``peer``'s message of ``step``; call ``wait_for`` first."""

    def abort(self, reason: str) -> None:
        """Fail the group: every rank's waits end with ``reason``."""


class PointToPointChannel(Protocol):
    """What point-to-point matching (p2p.Mailbox) and the receive loop may use: per-pair
    numbered messages (transport/pairs.py)."""

    rank: int
    size: int
    directory: str

    def send(self, dst: int, tensors: Sequence[torch.Tensor], tag: int, description: str) -> int:
        """Publish a message to ``dst`` (buffered: never waits for the receiver); its index."""

    def sent_to_me(self, src: int) -> int:
        """How many messages ``src`` has sent to this rank so far."""

    def open(self, src: int, index: int) -> Incoming:
        """The ``index``-th message from ``src`` (counted from 0)."""

    def discard(self, src: int, index: int, size: int) -> None:
        """Dispose of a consumed message (this rank is its only reader)."""

    def acknowledge(self, src: int, received: int) -> None:
        """Tell ``src`` how many of its messages this rank has consumed (bounds its sends)."""

    def flush_acknowledgements(self) -> None:
        """Write the counts ``acknowledge`` held back to ride with a later send: a sender at its
        cap of unreceived messages may be waiting for one (cheap when none is held)."""

    def wait_for_sends(
        self, attempt: Callable[[], bool | None], end: float, health_check: Callable[[], None], spin: bool = True
    ) -> bool:
        """Call ``attempt`` until it returns True (True) or ``end`` (monotonic) passes (False),
        pausing between attempts until a send may have arrived (files/waiting.py
        ``Waiter.for_sends``: False from ``attempt`` means it matched something else)."""

    def check_health(self, peer: int | None = None) -> None:
        """Raise if the group was aborted or a peer (``peer``, or any) is dead."""

    def abort(self, reason: str) -> None:
        """Fail the group: every rank's waits end with ``reason``."""


class TieredChannel(Protocol):
    """What a two-tier algorithm (collectives/hierarchical.py) may use: this rank's node's
    channel and, on a node's leader, the leaders' channel. Each is a CollectiveChannel of its
    own (local ranks, leader ranks), entered by the caller for the operation."""

    rank: int
    size: int
    nodes: Nodes

    @property
    def local(self) -> CollectiveChannel | None:
        """The ranks of this rank's node, numbered by ``Nodes.local_rank`` (None: alone on its node)."""

    @property
    def cross(self) -> CollectiveChannel | None:
        """One leader per node, numbered by node (None: not a leader, or a single node)."""
