"""Every wait: one loop with a deadline, paced by a Schedule, checking health as it goes.

Why no inotify: it does not see writes made by other NFS clients. Polling with a capped back-off
is the portable way; the cap bounds both the wake-up latency and the CPU a blocked rank burns.
Every wait in fsdist is this loop: a peer's step (``Waiter`` adds its doorbell), a busy lock
(files/locks.py), a reader's progress, a store key, a rendezvous. They differ only in their
Schedule and in what a pause is (a sleep, or a doorbell's wait that a wake-up ends early).

``Waiter`` is the one place that picks how a rank waits for its group's peers. A peer on this
machine wakes the rank through its doorbell when it reaches a step the rank waits for
(files/doorbell.py), so the rank sleeps in the kernel until the wake-up, and reads the peer's
record only then (or when a sleep ended without one: a wake-up lost to a full pipe, or sent
before this rank's pipe existed). Where a core is free for it, it busy-waits for the wake-up a
moment first: a sleeping virtual CPU takes 50-100 µs to wake, more than a small operation. A
peer on another machine cannot wake it: its record is polled, each look a READ on NFS, paced
by ``Pacing`` (files/pacing.py): when that peer tends to arrive is learned, and looked for then. Waits for any
peer (readers done with this rank's messages, stragglers catching up) sleep on the doorbell too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..defaults import (
    FIRST_SLEEP_SECONDS,
    HEALTH_CHECK_SECONDS,
    LOCK_MAX_SLEEP_SECONDS,
    LOCK_SPIN_SECONDS,
    LONG_SLEEP_SECONDS,
    LONG_WAIT_SECONDS,
    MAX_SLEEP_SECONDS,
    SPIN_SECONDS,
    WAKE_SPIN_SECONDS,
    WOKEN_MAX_SLEEP_SECONDS,
    WOKEN_REMOTE_SLEEP_SECONDS,
)
from .doorbell import RUN_QUEUE, Doorbell
from .pacing import Pacing, share_of_wait

T = TypeVar("T")

__all__ = [
    "BELL",
    "LOCKING",
    "POLLING",
    "WOKEN",
    "WOKEN_REMOTE",
    "Deadline",
    "Schedule",
    "Waiter",
    "poll",
]


class Deadline:
    """A point in monotonic time after which a wait gives up."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())


class Pace(Protocol):
    """What ``poll`` asks of its schedule (``Schedule``, ``Pacing``)."""

    @property
    def spin(self) -> float: ...

    @property
    def yields(self) -> bool: ...

    def next_pause(self, pause: float, waited: float) -> float: ...


@dataclass(frozen=True)
class Schedule:
    """How a wait paces its attempts: one after another for ``spin`` seconds (yielding the CPU
    between them where ``yields``), then pauses doubling from ``first`` up to ``cap``, and once
    the wait has lasted LONG_WAIT_SECONDS up to ``long_cap`` (a long wait is rarely ended by a
    short pause, and on NFS every attempt is a round trip); a lock's waiters (``grows`` False)
    stop at LONG_SLEEP_SECONDS, or the lock would go to those that retry sooner."""

    spin: float
    first: float
    cap: float
    yields: bool = False
    grows: bool = True

    def next_pause(self, pause: float, waited: float) -> float:
        """The pause after ``pause``, ``waited`` seconds into the wait."""
        return min(max(pause * 2, self.first), long_cap(self.cap, waited, self.grows))


def long_cap(cap: float, waited: float, grows: bool = True) -> float:
    """The longest pause ``waited`` seconds into a wait whose pauses stop at ``cap`` while short:
    LONG_SLEEP_SECONDS from LONG_WAIT_SECONDS on, then an eighth of the wait (LONGEST_SLEEP_SECONDS at
    most): noticed that much later, at a few looks a second."""
    if waited < LONG_WAIT_SECONDS:
        return cap
    if not grows:
        return max(cap, LONG_SLEEP_SECONDS)
    return max(cap, LONG_SLEEP_SECONDS, share_of_wait(waited))


def health_interval(waited: float) -> float:
    """How long after a health check, ``waited`` seconds into a wait, the next one comes: every
    HEALTH_CHECK_SECONDS, and as the pauses grow in a long wait, no more often than they (each
    check reads the abort record and a peer's heartbeat: READs on NFS)."""
    return max(HEALTH_CHECK_SECONDS, share_of_wait(waited))


#: attempts at once for a moment, then short pauses (a peer's step, a store key, a rendezvous)
POLLING = Schedule(SPIN_SECONDS, FIRST_SLEEP_SECONDS, MAX_SLEEP_SECONDS)
#: a busy lock: retried at once for a while, the CPU yielded to the holder in between; then
#: pauses short enough not to lose the lock to those that retry sooner (defaults.py says why)
LOCKING = Schedule(LOCK_SPIN_SECONDS, FIRST_SLEEP_SECONDS, LOCK_MAX_SLEEP_SECONDS, yields=True, grows=False)
#: a pause that a doorbell ends when a peer moves: no spinning (every attempt reads records)
BELL = Schedule(0.0, FIRST_SLEEP_SECONDS, MAX_SLEEP_SECONDS)
#: a peer that wakes this rank: its wake-up ends the sleep, the schedule is only the safety net
WOKEN = Schedule(0.0, LONG_SLEEP_SECONDS, WOKEN_MAX_SLEEP_SECONDS)
#: ...where each look is a round trip to a server (direct records): a later, sparser safety net
WOKEN_REMOTE = Schedule(0.0, WOKEN_REMOTE_SLEEP_SECONDS, 8 * WOKEN_REMOTE_SLEEP_SECONDS)


def poll(
    attempt: Callable[[], T | None],
    deadline: Deadline,
    on_timeout: Callable[[], BaseException],
    health_check: Callable[[float], None] | None = None,
    sleep: Callable[[float], object] = time.sleep,
    schedule: Pace = POLLING,
) -> T:
    """Call ``attempt`` until it returns something other than ``None``.

    ``health_check(seconds waited)`` runs every HEALTH_CHECK_SECONDS and raises to end the wait
    early (abort marker, dead peer, a lock holder that stopped). When the deadline passes,
    ``on_timeout()`` is raised. ``sleep(seconds)`` pauses between attempts (a doorbell's wait
    returns early when woken), paced by ``schedule``.
    """
    result = attempt()
    if result is not None:
        return result
    start = time.monotonic()
    next_health = start + HEALTH_CHECK_SECONDS
    pause = 0.0
    while True:
        now = time.monotonic()
        if now - start >= schedule.spin:
            pause = schedule.next_pause(pause, now - start)
            sleep(pause)
            now = time.monotonic()
        elif schedule.yields:
            os.sched_yield()
        result = attempt()
        if result is not None:
            return result
        if health_check is not None and now >= next_health:
            health_check(now - start)
            next_health = now + health_interval(now - start)
        if now >= deadline.end:
            raise on_timeout()


_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Waiter:
    """This rank's waits on the peers of one group (``bell``: the rank's doorbell in that group)."""

    def __init__(self, bell: Doorbell, size: int, looks_cost: bool = False) -> None:
        """``looks_cost``: each look is a round trip to a server (direct records), so a wait
        woken by its peer looks without a wake-up later and more sparsely (WOKEN_REMOTE)."""
        self.bell = bell
        self._woken = WOKEN_REMOTE if looks_cost else WOKEN
        self._size = size
        self._local_ranks = 0  # ranks of the group on this machine (see ``cores_to_spin``)
        self._pacing: dict[int, Pacing] = {}  # each peer on another client's
        self._all_wake = False  # every peer can ring this rank's bell (asked again until it is)

    def for_peer(
        self, peer: int, arrived: Callable[[], T | None], timeout: float, on_timeout: Callable[[], BaseException],
        health_check: Callable[[float], None], missed: bool = False,
    ) -> T:  # fmt: skip
        """Until ``arrived()`` returns something (it reads ``peer``'s record): by ``peer``'s wake-up
        where it can wake this rank, else by polling; for ``timeout`` seconds after a spin (a
        spin that ends the wait, the usual case, sets no deadline). ``missed``: the caller called
        ``arrived()`` just now, in vain (a peer on another client is not looked at again at once)."""
        if not self.bell.reaches(peer):  # another client: its steps are found by looking alone
            pacing = self._pacing.get(peer) or self._pacing.setdefault(peer, Pacing())
            return poll(pacing.wait(arrived, missed), Deadline(timeout), on_timeout, health_check, schedule=pacing)
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

        return poll(woken_and_arrived, Deadline(timeout), on_timeout, health_check, sleep, self._woken)

    def for_any(
        self, attempt: Callable[[], T | None], deadline: Deadline, on_timeout: Callable[[], BaseException],
        health_check: Callable[[float], None],
    ) -> T:  # fmt: skip
        """Until ``attempt()`` returns something, each attempt after a pause that any peer's wake-up
        ends (an attempt reads several peers' records: no spinning)."""
        return poll(attempt, deadline, on_timeout, health_check, self.bell.wait, BELL)

    def for_sends(
        self, attempt: Callable[[], bool | None], end: float, health_check: Callable[[], None],
        before_pause: Callable[[], None], spin: bool = True,
    ) -> bool:  # fmt: skip
        """Until ``attempt()`` returns True (True) or ``end`` passes (False): point-to-point
        receives, on a bell that peers' sends ring.

        ``attempt`` returns False where it matched receives but not the one awaited (the pauses
        start short again), None where it matched nothing. Between attempts: a spin on the bell
        for WAKE_SPIN_SECONDS where ``spin`` and cores allow; then sleeps that a send's wake-up
        ends: long where every peer can ring (MAX_SLEEP_SECONDS: only a safety net), else
        doubling from FIRST_SLEEP_SECONDS (a peer elsewhere is found only by looking; the receive
        loop's own thread, ``spin`` False, always keeps that schedule). ``before_pause`` runs
        before each (acknowledgements held back: a sender may wait for them); ``health_check``
        every HEALTH_CHECK_SECONDS, raising to end the wait."""
        start = time.monotonic()
        next_health = start + HEALTH_CHECK_SECONDS
        woken = spin and self.every_peer_wakes()
        first = MAX_SLEEP_SECONDS if woken else FIRST_SLEEP_SECONDS
        if woken:
            self.bell.wait(0.0)  # wake-ups of messages matched already: only later ones may end a sleep
        pause = 0.0
        while True:
            found = attempt()
            if found:
                return True
            now = time.monotonic()
            if now >= end:
                return False
            if found is False:
                pause = 0.0
                continue
            if now >= next_health:
                next_health = now + HEALTH_CHECK_SECONDS
                health_check()
            before_pause()
            if spin and now - start < WAKE_SPIN_SECONDS and self.cores_to_spin():
                if self.bell.spin(start + WAKE_SPIN_SECONDS - now):
                    continue  # woken while spinning: attempt at once
            pause = min(max(pause * 2, first), MAX_SLEEP_SECONDS, end - now)
            self.bell.wait(pause)

    def by_looking(
        self, attempt: Callable[[], T | None], deadline: Deadline, on_timeout: Callable[[], BaseException],
        health_check: Callable[[float], None],
    ) -> T:  # fmt: skip
        """Until ``attempt()`` returns something, for what no wake-up announces (a receiver's count
        of consumed messages, the rest of a peer's direct write): attempts at once for a moment,
        then short pauses (POLLING), never reading the bell (another thread may wait on it)."""
        return poll(attempt, deadline, on_timeout, health_check)

    def every_peer_wakes(self) -> bool:
        """Whether every peer of the group can ring this rank's bell (all of them on this machine)."""
        if not self._all_wake:
            self._all_wake = self.bell.local_ranks() >= self._size
        return self._all_wake

    def cores_to_spin(self) -> bool:
        """Whether a waiter may busy-wait: this machine has a core for each of the group's ranks
        on it (counted again until every rank of the group is found here), and no more threads
        than cores are runnable right now. A spin on a busy machine takes the core a peer needs:
        2 ranks, 8-byte all_reduce, two other busy threads on the 2 cores: 860 µs spinning, 240
        sleeping (Gloo 110)."""
        if self._local_ranks < self._size:
            self._local_ranks = self.bell.local_ranks()
        return self._local_ranks <= _CORES and RUN_QUEUE.core_free()
