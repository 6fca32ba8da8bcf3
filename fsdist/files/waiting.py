"""Waiting with a deadline: spin briefly, then back off, and check health while waiting.

Why no inotify: it does not see writes made by other NFS clients. Polling with a capped back-off
is the portable way; the cap bounds both the wake-up latency and the CPU a blocked rank burns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from ..defaults import (
    FIRST_SLEEP_SECONDS,
    HEALTH_CHECK_SECONDS,
    LONG_SLEEP_SECONDS,
    LONG_WAIT_SECONDS,
    MAX_SLEEP_SECONDS,
    SPIN_SECONDS,
)

T = TypeVar("T")

__all__ = ["Deadline", "poll"]


class Deadline:
    """A point in monotonic time after which a wait gives up."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())


def poll(
    attempt: Callable[[], T | None],
    deadline: Deadline,
    on_timeout: Callable[[], BaseException],
    health_check: Callable[[], None] | None = None,
    sleep: Callable[[float], object] = time.sleep,
    spin: float = SPIN_SECONDS,
    first_pause: float = FIRST_SLEEP_SECONDS,
) -> T:
    """Call ``attempt`` until it returns something other than ``None``.

    ``health_check`` runs every ``HEALTH_CHECK_SECONDS`` and raises to end the wait early
    (abort marker, dead peer). When the deadline passes, ``on_timeout()`` is raised.
    ``sleep(seconds)`` pauses between attempts; a doorbell's wait returns early when rung.
    For ``spin`` seconds attempts follow each other without a pause: pass 0 where a doorbell
    will end the sleep anyway (each attempt is a locked read: on NFS, a round trip), and a
    longer ``first_pause`` where the bell, not the schedule, is what ends a sleep.
    """
    result = attempt()
    if result is not None:
        return result
    start = time.monotonic()
    next_health = start + HEALTH_CHECK_SECONDS
    pause = first_pause
    while True:
        now = time.monotonic()
        if now - start >= spin:
            sleep(pause)
            cap = MAX_SLEEP_SECONDS if now - start < LONG_WAIT_SECONDS else LONG_SLEEP_SECONDS
            pause = min(pause * 2, max(cap, first_pause))
            now = time.monotonic()
        result = attempt()
        if result is not None:
            return result
        if health_check is not None and now >= next_health:
            health_check()
            next_health = now + HEALTH_CHECK_SECONDS
        if now >= deadline.end:
            raise on_timeout()
