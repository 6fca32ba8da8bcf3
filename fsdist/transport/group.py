"""One process group's transport over files: the two channels (interfaces.py) on one directory.

Three parts, each a job of its own: ``Progress`` (this rank's state record, its peers', the waits
on them and desync detection), ``Outbox`` (where this rank's messages go and how long they are
kept: until its peers are past them, spare files, the run-ahead bound) and ``Pairs``
(point-to-point messages and their counters). GroupTransport joins them into what the
collectives see (a CollectiveChannel), and orders what happens when an operation starts;
point-to-point matching sees ``Pairs`` itself (a PointToPointChannel).

Messages are files written once (files/io.py ``publish``, or rewritten spares) and named by what
they are (protocol/layout.py), so a reader that knows (peer, operation, step) knows the path.
The transport knows nothing of collectives: operations, steps and descriptions are opaque to it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from ..defaults import GC_EVERY
from ..errors import PeerFailedError, ProtocolError
from ..files.counters import Counter
from ..files.io import remove_tree
from ..files.trust import make_private_dir
from ..job.liveness import PeerWatch
from ..protocol import layout
from .incoming import FileMessage, PeerRings, open_incoming
from .interfaces import Incoming
from .locality import Locality
from .outbox import InSlot, Outbox
from .pairs import Pairs
from .progress import Progress

__all__ = ["GroupTransport"]


class GroupTransport:
    """Publishing and reading messages among the ranks of one group through its directory."""

    def __init__(
        self, directory: str, rank: int, size: int, watch: PeerWatch, timeout: float,
        names: Sequence[int] | None = None, tier: str = "", locality: Locality | None = None,
    ) -> None:  # fmt: skip
        """``names`` and ``tier``: for one tier of a two-tier group (Progress). ``locality``: what
        ``directory`` is to the group's ranks (default: ranks on several clients)."""
        make_private_dir(directory)
        self.directory = directory
        self.locality = locality if locality is not None else Locality.of(directory, one_client=False)
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.progress = Progress(directory, rank, size, watch, timeout, names, tier, self.locality.record_kind)
        self._entered = 0
        self.outbox = Outbox(self.progress, self.locality.reuse_files)
        self._mapped = self.outbox.spares.mapped if self.locality.maps_messages else None
        self._peer_rings = PeerRings()
        self.pairs = Pairs(self.progress, self.outbox, self.locality)

    # ---- an operation starts ------------------------------------------------------------

    def enter(self, seq: int, description: str) -> None:
        """Announce that this rank started operation ``seq``, described by ``description``."""
        self.progress.enter(seq, description)
        if self.pairs.ack_due:  # a peer blocked on its send cap may be needed here
            self.pairs.flush_acknowledgements()
        self._entered += 1  # a tier of a two-tier group sees only some of the group's operations
        self.outbox.collect_if_due(self._entered)
        if self._entered % GC_EVERY == 0:
            reason = self.progress.aborted.known()  # a rank that never waits must still hear of failures
            if reason is not None:
                raise PeerFailedError(f"{self.progress.where()}: the group was aborted: {reason}")
        self.outbox.hold_back_if_ahead(seq)

    # ---- CollectiveChannel --------------------------------------------------------------

    def publish(
        self, step: int, tensors: Sequence[torch.Tensor], tag: int = 0, readers: Sequence[int] | None = None
    ) -> None:
        """Publish this rank's message for (current operation, ``step``), then reach the step:
        in a slot of this rank's record, written with the step (or pointing into its ring file),
        or as a file (outbox.py). ``readers`` (interfaces.py) lets its space be reused as soon as
        they are past it."""
        where = self.outbox.publish(step, tag, tensors, self.progress.collective_seal(self.rank, step), readers)
        if isinstance(where, InSlot):
            self.progress.advance_inline(step, where.slot, where.data, readers)
        else:
            self.progress.advance(step, readers)

    def advance(self, step: int, waiters: Sequence[int] | None = None) -> None:
        self.progress.advance(step, waiters)

    def wait_for(self, peer: int, step: int) -> None:
        self.progress.wait_for(peer, step)

    def open_message(self, peer: int, step: int) -> Incoming:
        """Open ``peer``'s message for (current operation, ``step``); call ``wait_for`` first."""
        progress = self.progress
        check = progress.collective_seal(peer, step)

        def path() -> str:
            return os.path.join(self.directory, layout.message_name(peer, progress.seq, step))

        # optimistic reads: a file is opened before the record is read again under the lock to
        # confirm there is none (a message is either inline or a file, so a file found is it)
        slot = progress.inline_message(peer, step, confirm=not progress.optimistic)
        try:
            if slot is None and progress.optimistic:
                try:
                    return self._checked(peer, FileMessage(path(), check, self._mapped))
                except FileNotFoundError:
                    slot = progress.inline_message(peer, step)
            try:
                where = progress.state_path(peer)
                msg = open_incoming(slot, where, path, lambda: self._ring_of(peer), check, self._mapped)
            except ProtocolError as exc:  # (the context is only formatted when it is needed)
                raise ProtocolError(f"{exc} (message of operation #{progress.seq} step {step})") from None
        except FileNotFoundError:
            # the peer went past this operation without publishing this step: it ran another one
            state = progress.peer_state(peer)
            raise progress.desync(
                peer, f"(moved on to #{state.seq} '{state.description}' without publishing step {step})"
            ) from None
        return self._checked(peer, msg)

    def _checked(self, peer: int, msg: Incoming) -> Incoming:
        """``msg``, if it is of the operation this rank is in (else a desync, on every rank)."""
        progress = self.progress
        if msg.seq != progress.seq or msg.description != progress.description:
            msg.close()
            raise progress.desync(peer, msg.description)
        return msg

    def _ring_of(self, peer: int) -> tuple[int, str]:
        return self._peer_rings.open(os.path.join(self.directory, layout.collective_ring_name(peer)))

    def abort(self, reason: str) -> None:
        self.progress.abort(reason)

    # ---- leaving --------------------------------------------------------------------------

    def close(self) -> bool:
        """Leave the group. The last rank to leave removes the group directory; returns True then."""
        self.pairs.flush_acknowledgements()  # a sender may still wait for them before it sees this rank leave
        self.progress.close()
        self.pairs.close()
        self.outbox.close()  # before counting out: the last rank removes the directory
        self._peer_rings.close()
        with Counter(os.path.join(self.directory, layout.CLOSED_FILE)) as closed:
            last = closed.add(1) == self.size
        if last:
            remove_tree(self.directory)
        return last
