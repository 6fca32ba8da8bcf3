"""How a rank waits for its group's peers: the one place that picks a wait's strategy.

A peer on this machine wakes this rank through its doorbell when it reaches a step this rank waits for
(files/doorbell.py), so the rank sleeps in the kernel until the ring, and reads the peer's
record only then (or when a sleep ended without one: a ring lost to a full pipe, or sent
before this rank's pipe existed). Where a core is free for it, it busy-waits for the ring a
moment first: a sleeping virtual CPU takes 50-100 µs to wake, more than a small operation.
A peer on another machine cannot wake it: its record is polled (files/waiting.py). Waits for any
peer (readers done with this rank's messages, stragglers catching up) sleep on the doorbell too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

from ..defaults import WAKE_SPIN_SECONDS
from ..files.doorbell import RUN_QUEUE, Doorbell
from ..files.waiting import BELL, WOKEN, Deadline, poll

T = TypeVar("T")

__all__ = ["Waiter"]

_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Waiter:
    """This rank's waits on the peers of one group (``bell``: the rank's doorbell in that group)."""

    def __init__(self, bell: Doorbell, size: int) -> None:
        self.bell = bell
        self._size = size
        self._local_ranks = 0  # ranks of the group on this machine (see ``cores_to_spin``)

    def for_peer(
        self, peer: int, arrived: Callable[[], T | None], timeout: float, on_timeout: Callable[[], BaseException],
        health_check: Callable[[float], None],
    ) -> T:  # fmt: skip
        """Until ``arrived()`` returns something (it reads ``peer``'s record): by ``peer``'s wake-up
        where it can wake this rank, else by polling; for ``timeout`` seconds after a spin (a
        spin that ends the wait, the usual case, sets no deadline)."""
        if not self.bell.reaches(peer):  # another host: its steps are found by polling alone
            return poll(arrived, Deadline(timeout), on_timeout, health_check)
        if self.cores_to_spin():
            end = time.monotonic() + WAKE_SPIN_SECONDS
            while (left := end - time.monotonic()) > 0:
                if self.bell.spin(left) and self.bell.take_wakeup(peer):
                    found = arrived()
                    if found is not None:
                        return found
        quiet = False  # the last sleep ended without any wake-up: look anyway

        def woken_and_arrived() -> T | None:
            return arrived() if self.bell.take_wakeup(peer) or quiet else None

        def sleep(seconds: float) -> None:
            nonlocal quiet
            quiet = not self.bell.wait(seconds)

        return poll(woken_and_arrived, Deadline(timeout), on_timeout, health_check, sleep, WOKEN)

    def for_any(
        self, attempt: Callable[[], T | None], deadline: Deadline, on_timeout: Callable[[], BaseException],
        health_check: Callable[[float], None],
    ) -> T:  # fmt: skip
        """Until ``attempt()`` returns something, each attempt after a pause that any peer's wake-up
        ends (an attempt reads several peers' records: no spinning)."""
        return poll(attempt, deadline, on_timeout, health_check, self.bell.wait, BELL)

    def cores_to_spin(self) -> bool:
        """Whether a waiter may busy-wait: this machine has a core for each of the group's ranks
        on it (counted again until every rank of the group is found here), and no more threads
        than cores are runnable right now. A spin on a busy machine takes the core a peer needs:
        2 ranks, 8-byte all_reduce, two other busy threads on the 2 cores: 860 µs spinning, 240
        sleeping (Gloo 110)."""
        if self._local_ranks < self._size:
            self._local_ranks = self.bell.local_ranks()
        return self._local_ranks <= _CORES and RUN_QUEUE.core_free()
