"""Waiting with a deadline: one loop for every wait, paced by a Schedule, checking health as it goes.

Why no inotify: it does not see writes made by other NFS clients. Polling with a capped back-off
is the portable way; the cap bounds both the wake-up latency and the CPU a blocked rank burns.
Every wait in fsdist is this loop: a peer's step (transport/waiter.py adds its doorbell), a
busy lock (files/locks.py), a reader's progress, a store key, a rendezvous. They differ only in
their Schedule and in what a pause is (a sleep, or a doorbell's wait that a ring ends early).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..defaults import (
    FIRST_SLEEP_SECONDS,
    HEALTH_CHECK_SECONDS,
    LOCK_MAX_SLEEP_SECONDS,
    LOCK_SPIN_SECONDS,
    LONG_SLEEP_SECONDS,
    LONG_WAIT_SECONDS,
    MAX_SLEEP_SECONDS,
    SPIN_SECONDS,
)

T = TypeVar("T")

__all__ = ["BELL", "LOCKING", "POLLING", "WOKEN", "Deadline", "Schedule", "poll"]


class Deadline:
    """A point in monotonic time after which a wait gives up."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())


@dataclass(frozen=True)
class Schedule:
    """How a wait paces its attempts: one after another for ``spin`` seconds (yielding the CPU
    between them where ``yields``), then pauses doubling from ``first`` up to ``cap``, and up to
    LONG_SLEEP_SECONDS once the wait has lasted LONG_WAIT_SECONDS (a long wait is rarely ended
    by a short pause, and on NFS every attempt is a round trip)."""

    spin: float
    first: float
    cap: float
    yields: bool = False

    def next_pause(self, pause: float, waited: float) -> float:
        """The pause after ``pause``, ``waited`` seconds into the wait."""
        cap = self.cap if waited < LONG_WAIT_SECONDS else max(self.cap, LONG_SLEEP_SECONDS)
        return min(max(pause * 2, self.first), cap)


#: attempts at once for a moment, then short pauses (a peer's step, a store key, a rendezvous)
POLLING = Schedule(SPIN_SECONDS, FIRST_SLEEP_SECONDS, MAX_SLEEP_SECONDS)
#: a busy lock: retried at once for a while, the CPU yielded to the holder in between; then
#: pauses short enough not to lose the lock to those that retry sooner (defaults.py says why)
LOCKING = Schedule(LOCK_SPIN_SECONDS, FIRST_SLEEP_SECONDS, LOCK_MAX_SLEEP_SECONDS, yields=True)
#: a pause that a doorbell ends when a peer moves: no spinning (every attempt reads records)
BELL = Schedule(0.0, FIRST_SLEEP_SECONDS, MAX_SLEEP_SECONDS)
#: a peer that wakes this rank: its wake-up ends the sleep, the schedule is only the safety net
WOKEN = Schedule(0.0, LONG_SLEEP_SECONDS, LONG_SLEEP_SECONDS)


def poll(
    attempt: Callable[[], T | None],
    deadline: Deadline,
    on_timeout: Callable[[], BaseException],
    health_check: Callable[[float], None] | None = None,
    sleep: Callable[[float], object] = time.sleep,
    schedule: Schedule = POLLING,
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
            next_health = now + HEALTH_CHECK_SECONDS
        if now >= deadline.end:
            raise on_timeout()
