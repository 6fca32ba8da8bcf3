"""Point-to-point messages between pairs of ranks: numbered per pair, counted in the records.

Sends are buffered: a send publishes ``p<src>-<dst>.<index>`` and raises the sender's ``sent``
counter for that receiver in its state record, then returns. The receiver reads the counter,
consumes the messages (p2p.Mailbox matches them to receives), and raises its ``received``
counter for that sender; a sender that has MAX_UNRECEIVED_SENDS messages unreceived by one rank
waits until that rank catches up. A consumed message becomes the receiver's spare, or goes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import torch

from ..defaults import MAX_UNRECEIVED_SENDS
from ..files.doorbell import Doorbell
from ..files.waiting import poll
from ..protocol import layout, message, state_record
from .progress import Progress
from .retention import Retention

__all__ = ["Pairs"]


class Pairs:
    """This rank's sending and receiving counters, and its point-to-point message files."""

    def __init__(self, progress: Progress, retention: Retention) -> None:
        self._progress = progress
        self._retention = retention
        self.directory = progress.directory
        self._sent = [0] * progress.size
        self._lock = threading.Lock()
        # receives are matched on their own thread: a bell of their own, so neither waiter
        # swallows the other's wake-up
        self._bell = Doorbell(
            [layout.p2p_doorbell_file(self.directory, r) for r in range(progress.size)], progress.rank
        )

    def send(self, dst: int, tensors: Sequence[torch.Tensor], tag: int, description: str) -> int:
        """Publish a message to ``dst`` (buffered: never waits for the receiver). Returns its index."""
        rank = self._progress.rank
        with self._lock:  # threads sending at once must not take the same index
            if self._sent[dst] >= MAX_UNRECEIVED_SENDS:
                self._wait_for_receiver(dst)
            index = self._sent[dst]
            buffers = message.encode(index, tag, description, tensors)
            _, spare = self._retention.write(layout.p2p_name(rank, dst, index), buffers, sum(len(b) for b in buffers))
            if spare is not None:
                spare.close(remove=False)  # the receiver owns the file now; this rank forgets it
            self._sent[dst] = index + 1
            self._progress.write_counter(state_record.sent_offset(dst), index + 1)
            self._bell.ring([dst])
        return index

    def sent_to_me(self, src: int) -> int:
        return self._progress.read_counter(src, state_record.sent_offset(self._progress.rank))

    def acknowledge(self, src: int, received: int) -> None:
        self._progress.write_counter(state_record.received_offset(src, self._progress.size), received)

    def open(self, src: int, index: int) -> message.Message:
        return message.Message(os.path.join(self.directory, layout.p2p_name(src, self._progress.rank, index)))

    def discard(self, src: int, index: int, size: int) -> None:
        """The receiver disposes of a message it consumed (its only reader): a spare, or deleted."""
        path = os.path.join(self.directory, layout.p2p_name(src, self._progress.rank, index))
        self._retention.spares.give_back(path, size)

    def wait_for_sends(self, seconds: float) -> None:
        self._bell.wait(seconds)

    def close(self) -> None:
        self._bell.close()

    def _wait_for_receiver(self, dst: int) -> None:
        progress = self._progress
        offset = state_record.received_offset(progress.rank, progress.size)

        def room() -> bool | None:
            return True if self._sent[dst] - progress.read_counter(dst, offset) < MAX_UNRECEIVED_SENDS else None

        what = f"receives of this rank's sends (at most {MAX_UNRECEIVED_SENDS} may wait unreceived)"
        poll(room, progress.deadline(), lambda: progress.timed_out(dst, what), lambda: progress.check_health(dst))
